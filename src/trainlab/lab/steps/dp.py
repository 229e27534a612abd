"""Data parallel: LeNet-5 on one process, DataParallel, DDP, hand-written and ring all-reduce (strong
scaling; on several GPUs also weak), the DataLoader-workers study, compile/CUDA graphs, graph breaks."""

from __future__ import annotations

from trainlab.hardware import Machine
from trainlab.lab.steps.base import Step, pick, script, trainlab
from trainlab.lab.steps.scripts import CompileBreaksConfig, CompileConfig
from trainlab.lenet.config import AsyncConfig, CompareConfig

GPU_ONLY = "not applicable on a CPU: "  # a step the lab lists on a CPU only to say why it does not run there
DP_BATCH = 128  # LeNet-5's global batch in the data-parallel comparison (`dp compare`'s default)


def steps(hw: Machine, size: str) -> list[Step]:
    dev = hw.device
    ranks = max(1, hw.gpus) if hw.gpu else max(2, hw.gpus)
    backend = "nccl" if hw.gpu else "gloo"
    modes = pick(
        size, "none,ddp", "none,ddp,allreduce,ring", "none,dp,ddp,allreduce,ring" if hw.gpus > 1 else "none,ddp"
    )
    sub = pick(
        size,
        dict(train_subset=512, test_subset=256, workers="0,1"),
        dict(train_subset=8192, test_subset=2048, workers="0,1,2", threads=1),
        {},
    )
    common = dict(device=dev, nproc=ranks, epochs=1, json="{out}/dp_compare.json", md="{out}/dp_compare.md")
    compare = CompareConfig(modes=modes, batch_size=DP_BATCH, **common, **sub)
    out = [
        Step(
            "dp_compare",
            "dp",
            "Data parallel: single process, DataParallel, DDP, hand-written and ring all-reduce, "
            "and the DataLoader-workers study",
            pick(size, 65, 50, hw.scale(105, "memory")),
            trainlab("dp", "compare", config=compare),
            sizes={
                "ranks": ranks,
                "modes": modes,
                "backend": backend,
                "scaling": f"strong: global batch {DP_BATCH} on every mode",
            },
        )
    ]
    if not hw.gpu or (hw.gpus > 1 and size == "full"):
        # weak scaling: each GPU keeps the single process's batch, so N GPUs take N times the images per
        # step (set against dp_compare's single-process row); the communication share is comm ms / step ms
        weak = CompareConfig(modes="dp,ddp,allreduce,ring", batch_size=DP_BATCH * ranks, workers="", **common)
        out.append(
            Step(
                "dp_weak",
                "dp",
                "Data parallel, weak scaling: the per-GPU batch kept",
                hw.scale(60, "memory") if hw.gpu else 0,
                trainlab("dp", "compare", config=weak),
                sizes={
                    "ranks": ranks,
                    "modes": weak.modes,
                    "backend": backend,
                    "scaling": f"weak: {DP_BATCH} per GPU, global batch {DP_BATCH * ranks}",
                },
                cannot_run=None if hw.gpu else GPU_ONLY + "weak scaling keeps each GPU's batch across several GPUs",
            )
        )
    compile_ = CompileConfig(
        device=dev,
        out="{out}",
        **pick(size, dict(steps=3, variants="eager"), dict(steps=30, threads=2), dict(steps=200)),
    )
    out += [
        Step(
            "dp_compile",
            "dp",
            "Eager vs torch.compile vs CUDA graphs, and the asynchronous-timing demo",
            pick(size, 25, 45, hw.scale(40, "memory")),
            script(compile_),
            sizes={"steps": compile_.steps},
        ),
        Step(
            "compile_breaks",
            "dp",
            "What breaks under torch.compile: graph breaks and recompiles, counted by TorchDynamo",
            pick(size, 25, 20, 25),
            script(CompileBreaksConfig(out="{out}")),
        ),
        Step(
            "async_parallelism",
            "dp",
            "Asynchronous execution and automatic parallelism: queued vs finished, t1 + N·t2 + t3, two streams, "
            "a copy beside compute, CPU and GPU at once",
            # seconds on the loaded 2-core box at 1 thread (i38l's run); on a GPU most of it is the LeNet steps
            pick(size, 20, 60, 30),
            trainlab(
                "async",
                config=AsyncConfig(
                    device=dev,
                    repeats=pick(size, 1, 3, 5),
                    ops=pick(size, 100, 1000, 1000),
                    size=pick(size, 128, 256, 1024),
                    threads=None if hw.gpu else 1,
                    json="{out}/async_parallelism.json",
                    md="{out}/async_parallelism.md",
                ),
            ),
            sizes={"device": dev},
        ),
    ]
    return out
