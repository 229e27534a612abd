"""The lab's deliverables as steps, in priority order, sized to the hardware found.

Each step is one existing command (`trainlab …` or a script of `benchmarks/`) run as a subprocess, so
a hung step can be killed without killing the lab, and a step measures exactly what a student gets by
typing the same line. A step carries its time estimate for this hardware and size, and its hard limit.

Sizes (recorded in results.json with each step):
- `tiny`:  seconds per step, for CI and for trying the command (numbers mean nothing);
- `small`: a CPU: the real commands at sizes a laptop finishes in half an hour, 2 gloo ranks;
- `full`:  one or more GPUs: the handout's sizes (GPT-2 1.6B, full MNIST, large GELU tensors),
  the parallel steps across every GPU found.

Estimates are seconds: `small` = measured by the full CPU lab of `benchmarks/lab_cpu.md` on a loaded
2-core box (a quiet machine is faster: the safe direction); `tiny` = the tiny lab of
`tests/test_lab.py` on the same box; `full` = measured on one H100 (benchmarks/results/gpu/h100/lab/
results.json, "seconds"; `tests/test_lab_estimates.py` keeps them within ±30 % of it), so a 1-GPU lab
fits two 9-minute calls (`--parts gpt,lenet`, then `--parts gelu,ops,dp`). A budget is only as good as
them: recalibrate from a run's results.json ("seconds" against "estimate_s").
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainlab.lab.plan import OPTIMIZER, plan_gpt

PARTS = ("lenet", "gelu", "ops", "dp", "gpt")
SIZES = ("tiny", "small", "full")

# The handout's GPT-2 (hidden 1600, 48 layers, 32 heads, seq 1024) on a GPU; the tiny preset elsewhere.
GPT_GPU_MODEL = "gpt2-1.6b"
GPT_CPU_MODEL = "tiny"
# issue 30's model levers, on in gpt_best (gpt bench flags)
GPT_LEVERS = ("--vocab-multiple", "64", "--fused-qkv", "--loss", "chunked")
DP_BATCH = 128  # LeNet-5's global batch in the data-parallel comparison (`dp compare`'s default)


@dataclass(frozen=True)
class Hardware:
    """What the lab runs on. `name`/`peak_tflops` may be given by hand (`--device-name`, `--peak-tflops`)
    to plan a GPU run from a machine without one."""

    kind: str  # cpu | cuda
    gpus: int = 0
    name: str = "cpu"
    peak_tflops: float | None = None  # dense bf16, per device
    memory_bytes: int | None = None  # per device
    sm: int | None = None  # compute capability × 10
    cpus: int = 1

    @property
    def device(self) -> str:
        return "cuda" if self.kind == "cuda" else "cpu"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Step:
    name: str
    part: str
    title: str
    estimate_s: float  # expected seconds on this hardware at this size
    argv: tuple[str, ...]  # "{out}" stands for the step's own output directory
    stdout_file: str | None = None  # also keep stdout alone in {out}/<this> (a command's --json output)
    sizes: dict = field(default_factory=dict)  # what was chosen for this hardware (recorded)
    cannot_run: str | None = None  # why this step cannot run here at all (recorded as "not run: …")
    min_limit_s: float = 60.0  # a floor under the limit, for a step whose time varies by GPU far more than 3×

    @property
    def limit_s(self) -> float:
        """The hard limit: a step that takes three times its estimate is broken, not slow."""
        return max(self.min_limit_s, 3.0 * self.estimate_s)


def repo_root() -> Path:
    """The checkout trainlab runs from (src/trainlab/lab/steps.py → the repository)."""
    return Path(__file__).resolve().parents[3]


def benchmarks_dir() -> Path:
    return repo_root() / "benchmarks"


def _tl(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "trainlab", *args)


def _bench(script: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, str(benchmarks_dir() / script), *args)


def _pick(size: str, tiny, small, full):
    return {"tiny": tiny, "small": small, "full": full}[size]


def lab_steps(hw: Hardware, size: str) -> list[Step]:
    """Every step of the lab for `hw` at `size`, in priority order (the order they run in)."""
    dev = hw.device
    ranks = max(2, hw.gpus) if hw.kind == "cpu" else max(1, hw.gpus)
    steps: list[Step] = []

    def add(name, part, title, est, argv, **kw):
        steps.append(Step(name, part, title, float(est), tuple(argv), **kw))

    # ---------------------------------------------------------------- LeNet-5
    # small: 2 epochs of the default recipe (98.4 % at epoch 2 on a CPU; the full 5 on a loaded 2-core box
    # take ~12 min of a 30-min lab)
    lenet_sub = _pick(size, ["--epochs", "1", "--train-subset", "2048", "--test-subset", "1024"], ["--epochs", "2"], [])
    add(
        "lenet_train",
        "lenet",
        "LeNet-5, default recipe: curves, accuracy, telemetry",
        _pick(size, 25, 450, 15),
        _tl("train", "--device", dev, "--no-progress", *lenet_sub, "--out", "{out}/lenet-default"),
        sizes={"epochs": _pick(size, "1 (2,048 images)", "2", "default (5)")},
    )
    # On a GPU: the fast recipe's CUDA-graph step on 10 seeds (issue 29: ≥ 99 % on ≥ 9 of 10), the
    # seed-style loop (~30 s a seed there) on 3 of them for the ratio.
    gpu_seeds = ["--seeds", "0,1,2,3,4,5,6,7,8,9", "--baseline-seeds", "0,1,2"]
    add(
        "lenet_time_to_99",
        "lenet",
        "Time to 99 % test accuracy: fast recipe vs the seed-style loop",
        _pick(size, 0, 750, 120),
        _bench(
            "lenet_time_to_99.py",
            "--device",
            dev,
            "--loops",
            "fast,seed-style",
            *(["--seeds", "0"] if hw.kind == "cpu" else gpu_seeds),
            "--max-epochs",
            "8",
            "--out",
            "{out}",
        ),
        sizes={"seeds": 1 if hw.kind == "cpu" else 10, "seed-style seeds": 1 if hw.kind == "cpu" else 3},
        cannot_run="trains to 99 % on full MNIST: no tiny size" if size == "tiny" else None,
    )
    no_tf32 = (
        "TF32 does not apply: a tensor-core mode of NVIDIA GPUs (Ampere+), not of a CPU"
        if hw.kind != "cuda"
        else f"TF32 does not apply: it needs sm80+ (Ampere), this GPU is sm{hw.sm}"
        if hw.sm and hw.sm < 80
        else None
    )
    # the ablation's and the offload rows' strategies are bf16 ("amp"): sm80+ only (a 2080 Ti has no bf16)
    no_bf16 = (
        f"bf16 autocast needs sm80+ (Ampere); this GPU is sm{hw.sm}"
        if hw.kind == "cuda" and hw.sm and hw.sm < 80
        else None
    )
    add(
        "lenet_tf32",
        "lenet",
        "TF32 off/on: the LeNet-5 default recipe in fp32",
        _pick(size, 0, 0, 30),
        _bench("lenet_tf32.py", "--device", dev, "--out", "{out}"),
        sizes={"epochs": 2, "rounds": 2},
        cannot_run=no_tf32,
    )
    # ---------------------------------------------------------------- GELU
    gelu_impls = _pick(size, ["--impl", "aten", "--impl", "python", "--dtype", "float32", "--n", "256"], [], [])
    add(
        "gelu_check",
        "gelu",
        "GELU: Python / C++ / GPU implementations against a float64 reference",
        _pick(size, 20, 120, 45),
        _tl("gelu", "check", "--json", *gelu_impls),
        stdout_file="gelu_check.json",
    )
    # full: up to 256M elements, where issue 29's bandwidth goal is set (far above the 50 MB L2)
    bench = _pick(
        size,
        ["--sizes", "1K", "--impl", "python", "--budget", "0.01"],
        ["--quick"],
        ["--sizes", "1K,1M,16M,64M,256M", "--budget", "0.2"],
    )
    add(
        "gelu_bench",
        "gelu",
        "GELU speed: forward and backward against F.gelu",
        _pick(size, 15, 30, 25),
        _tl("gelu", "bench", "--device", dev, *bench, "--out", "{out}"),
        sizes={"tensor sizes": _pick(size, "1K", "1K, 64K, 1M", "1K to 256M elements")},
    )
    gelu_act = _pick(size, "gelu-python", "gelu-cpp", "gelu-cuda")
    gelu_train = _pick(size, ["--epochs", "1", "--train-subset", "1024", "--test-subset", "512"], ["--epochs", "1"], [])
    add(
        "gelu_train",
        "gelu",
        f"LeNet-5 trained with our GELU ({gelu_act})",
        _pick(size, 25, 290, 20),
        _tl(
            "train",
            "--device",
            dev,
            "--act",
            gelu_act,
            "--no-progress",
            *gelu_train,
            "--out",
            "{out}/lenet-" + gelu_act,
        ),
        sizes={"act": gelu_act, "epochs": _pick(size, 1, 1, 5)},
    )
    # ---------------------------------------------------------------- own operators
    ops_impls = _pick(
        size,
        ["--op", "max_pool2d", "--impl", "aten", "--impl", "python", "--dtype", "float32", "--case", "batch1-overlap"],
        ["--impl", "aten", "--impl", "python", "--impl", "cpp"],
        ["--impl", "aten", "--impl", "cuda", "--impl", "triton", "--batch", "64"],
    )
    add(
        "ops_check",
        "ops",
        "Own conv2d / max-pool / linear / ReLU against ATen",
        _pick(size, 25, 125, 120),
        _tl("ops", "check", *ops_impls, "--no-gelu", "--out", "{out}"),
    )
    ops_bench = _pick(size, ["--impl", "python", "--layer", "pool1", "--quick"], ["--quick"], [])
    add(
        "ops_bench",
        "ops",
        "Own operators: time per LeNet-5 layer against ATen",
        _pick(size, 20, 95, 45),
        _tl("ops", "bench", "--device", dev, *ops_bench, "--out", "{out}"),
    )
    own = _pick(size, "own=python", "own=cpp", "own=cuda")
    ops_train = _pick(
        size,
        ["--epochs", "1", "--train-subset", "512", "--test-subset", "256"],
        ["--epochs", "1", "--train-subset", "16384"],
        [],
    )
    add(
        "ops_train",
        "ops",
        f"LeNet-5 trained on our operators ({own})",
        _pick(size, 35, 320, 20),
        _tl(
            "train",
            "--device",
            dev,
            "--ops",
            own,
            "--no-progress",
            *ops_train,
            "--out",
            "{out}/lenet-ops-" + own.replace("=", "-"),
        ),
        sizes={"ops": own, "epochs": _pick(size, "1 (512 images)", "1 (16,384 images)", 5)},
    )
    # ---------------------------------------------------------------- data parallel
    modes = _pick(
        size, "none,ddp", "none,ddp,allreduce,ring", "none,dp,ddp,allreduce,ring" if hw.gpus > 1 else "none,ddp"
    )
    dp_sub = _pick(
        size,
        ["--train-subset", "512", "--test-subset", "256", "--workers", "0,1"],
        ["--train-subset", "8192", "--test-subset", "2048", "--workers", "0,1,2", "--threads", "1"],
        [],
    )
    add(
        "dp_compare",
        "dp",
        "Data parallel: single process, DataParallel, DDP, hand-written and ring all-reduce, "
        "and the DataLoader-workers study",
        _pick(size, 65, 185, 105),
        _tl(
            "dp",
            "compare",
            "--device",
            dev,
            "--modes",
            modes,
            "--nproc",
            str(ranks),
            "--epochs",
            "1",
            "--batch-size",
            str(DP_BATCH),
            *dp_sub,
            "--json",
            "{out}/dp_compare.json",
            "--md",
            "{out}/dp_compare.md",
        ),
        sizes={
            "ranks": ranks,
            "modes": modes,
            "backend": "gloo" if hw.kind == "cpu" else "nccl",
            "scaling": f"strong: global batch {DP_BATCH} on every mode",
        },
    )
    if hw.kind == "cuda" and hw.gpus > 1 and size == "full":
        # weak scaling: each GPU keeps the single process's batch, so N GPUs take N times the images per
        # step (set against dp_compare's single-process row); the communication share is comm ms / step ms
        weak = "dp,ddp,allreduce,ring"
        add(
            "dp_weak",
            "dp",
            "Data parallel, weak scaling: the per-GPU batch kept",
            60,
            _tl(
                "dp",
                "compare",
                "--device",
                dev,
                "--modes",
                weak,
                "--nproc",
                str(ranks),
                "--epochs",
                "1",
                "--batch-size",
                str(DP_BATCH * ranks),
                "--workers",
                "",
                "--json",
                "{out}/dp_compare.json",
                "--md",
                "{out}/dp_compare.md",
            ),
            sizes={
                "ranks": ranks,
                "modes": weak,
                "backend": "nccl",
                "scaling": f"weak: {DP_BATCH} per GPU, global batch {DP_BATCH * ranks}",
            },
        )
    compile_args = _pick(
        size, ["--steps", "3", "--variants", "eager"], ["--steps", "30", "--threads", "2"], ["--steps", "200"]
    )
    add(
        "dp_compile",
        "dp",
        "Eager vs torch.compile vs CUDA graphs, and the asynchronous-timing demo",
        _pick(size, 25, 180, 40),
        _bench("dp_compile.py", "--device", dev, *compile_args, "--out", "{out}"),
        sizes={"steps": compile_args[1]},
    )
    add(
        "compile_breaks",
        "dp",
        "What breaks under torch.compile: graph breaks and recompiles, counted by TorchDynamo",
        _pick(size, 25, 30, 25),
        _bench("compile_breaks.py", "--out", "{out}"),
    )
    # ---------------------------------------------------------------- GPT-2
    # On a GPU every row is chosen by the memory planner for this hardware (`lab.plan`): the model, the
    # micro-batch, amp or fp16, ckpt where a row needs it; on a CPU the tiny preset.
    gpu = hw.kind == "cuda"
    gp = plan_gpt(max(1, hw.gpus), hw.memory_bytes or 80 * 2**30, hw.sm or 90) if gpu else None
    model = gp.model if gpu else GPT_CPU_MODEL
    mem = f"{hw.memory_bytes}B" if hw.memory_bytes else "80GiB"  # --gpu-mem needs a unit
    sm = str(hw.sm or 90)
    add(
        "gpt_plan",
        "gpt",
        "GPT-2 1.6B memory plan for this device (every strategy)",
        _pick(size, 15, 15, 14),
        _tl(
            "gpt",
            "plan",
            "--model",
            GPT_GPU_MODEL,
            "--gpus",
            str(max(1, hw.gpus)),
            "--gpu-mem",
            mem,
            "--micro-batch",
            str(gp.micro_batch) if gpu else "8",
            "--optimizer",
            OPTIMIZER,
            "--sm",
            sm,
            "--json",
            "{out}/plan.json",
        ),
        sizes={"model": GPT_GPU_MODEL, "gpus": max(1, hw.gpus), "memory": mem},
    )
    common = ["--model", model, "--device", dev] + (
        ["--global-batch", str(gp.global_batch)] if gpu else ["--global-batch", "8", "--seq", "64"]
    )
    steps_w = ["--steps", "8", "--warmup", "3"] if gpu else ["--steps", _pick(size, "2", "5", "5"), "--warmup", "1"]
    # the planner's fastest single-GPU row (lab.plan), with issue 30's levers: padded vocabulary, fused QKV,
    # chunked cross-entropy and the largest micro-batch that fits with them (the planner again)
    best = (
        [
            "--strategy",
            gp.best.strategy,
            "--micro-batch-auto",
            "--fused-optimizer",
            *(["--tf32", "on"] if not no_tf32 else []),
            *GPT_LEVERS,
        ]
        if gpu
        else ["--strategy", "none", "--micro-batch", "4", *GPT_LEVERS]
    )
    add(
        "gpt_best",
        "gpt",
        "GPT-2: our fastest single-device configuration",
        # 37.5 s on the H100 as amp+compile+accum at micro-batch 8; issue 30's levers since (not yet
        # measured: the compile dominates, as before)
        _pick(size, 20, 40, 60),
        _tl("gpt", "bench", *common, *best, *steps_w, "--json", "{out}/bench.json"),
        sizes={
            "model": model,
            "strategy": best[1],
            "micro_batch": "largest that fits with the levers (planner)" if gpu else best[3],
            **({"predicted_gib_without_levers": round(gp.best.predicted_bytes / 2**30, 1)} if gpu else {}),
        },
    )
    base_steps = ["--steps", "4", "--warmup", "1"] if gpu else ["--steps", _pick(size, "2", "5", "5"), "--warmup", "1"]

    # fp32 without TF32, checkpointing: the handout's setting. Its limit is generous: fp32 on the GPU is
    # ~6x slower per step than bf16, and the old suite's 150 s cut it off (issue 18); 51 s on an H100,
    # an A100's fp32 rate is a third of it.
    def baseline(tf32: str) -> tuple[str, ...]:
        """The handout's baseline (HF GPT2LMHeadModel, fp32, checkpointing) with TF32 `off` or `on`."""
        micro = str(gp.baseline.micro_batch) if gpu else "4"
        return _tl("gpt", "bench", *common, "--impl", "hf", "--strategy", "ckpt", "--tf32", tf32,
                   "--micro-batch", micro, *base_steps, "--json", "{out}/bench.json")  # fmt: skip

    add(
        "gpt_baseline",
        "gpt",
        "GPT-2: the handout's baseline (HF GPT2LMHeadModel, fp32, checkpointing)",
        _pick(size, 35, 70, 50),
        baseline("off"),
        sizes={"model": model, "impl": "hf", "strategy": "ckpt", "tf32": "off"},
        min_limit_s=300,
    )
    # the same baseline with TF32 on (report 000's trick): the row beside it
    add(
        "gpt_baseline_tf32",
        "gpt",
        "GPT-2: the handout's baseline with TF32 on",
        _pick(size, 0, 0, 45),
        baseline("on"),
        sizes={"model": model, "impl": "hf", "strategy": "ckpt", "tf32": "on"},
        cannot_run=no_tf32,
        min_limit_s=300,
    )
    strategies = gp.strategies if gpu else _pick(size, "none,ddp", "none,ckpt,ddp,zero3,tp,pp", "")
    nproc = str(hw.gpus if gpu and hw.gpus > 1 else 1 if gpu else 2)
    add(
        "gpt_strategies",
        "gpt",
        "GPT-2: parallel and memory strategies side by side, on the same data",
        # full: 25 s a row on the H100 (74.7 s for 3 rows in the lab run of 2026-11-25); 40 s a row on
        # several GPUs leaves room for the slower A100 and the process groups' start-up
        _pick(size, 60, 115, 20 + (25 if hw.gpus <= 1 else 40) * len(gp.rows) if gpu else 200),
        _tl(
            "gpt",
            "compare",
            "--strategies",
            strategies,
            *common,
            "--nproc",
            nproc,
            "--micro-batch",
            str(gp.micro_batch) if gpu else "4",
            *(["--steps", "3", "--warmup", "1"] if gpu else steps_w),
            "--timeout",
            "240",
            "--out",
            "{out}",
        ),
        sizes={
            "model": model,
            "strategies": strategies,
            "ranks": int(nproc),
            **(
                {
                    "global_batch": gp.global_batch,
                    "micro_batch": gp.micro_batch,
                    "precision": gp.precision,
                    "predicted_gib": {r.strategy: round(r.predicted_bytes / 2**30, 1) for r in gp.rows},
                    "left_out": dict(gp.left_out),
                    **({"model_note": gp.note} if gp.note else {}),
                }
                if gpu
                else {}
            ),
        },
    )
    # issue 30: from the handout's baseline to gpt_best, each change alone and cumulatively, and the peer
    # row, every row on the same tokens. full: the baseline, the 10 cumulative rows and the peer, ~12 runs
    # of 25-60 s on an H100 (estimated, not yet measured; compile rows reuse inductor's on-disk cache);
    # the "alone" rows double that and are `gpt ablation`'s default outside the lab
    ablation = _pick(
        size,
        ["--changes", "tf32,ours", "--groups", "baseline,cumulative"],
        ["--changes", "tf32,ours,bf16,vocab-pad,chunked-ce,max-micro-batch"],
        ["--groups", "baseline,cumulative,peer,separate"],
    )
    add(
        "gpt_ablation",
        "gpt",
        "GPT-2: the speed-up broken down, from the handout's baseline to ours, and a peer",
        _pick(size, 30, 120, 450),
        _tl(
            "gpt",
            "ablation",
            *common,
            "--micro-batch",
            str(gp.micro_batch) if gpu else "4",
            *(["--steps", "4", "--warmup", "1"] if gpu else steps_w),
            *ablation,
            "--timeout",
            "300",
            "--out",
            "{out}",
        ),
        sizes={"model": model, "rows": " ".join(ablation), "tokens_per_row": "global batch × seq × steps"},
        cannot_run=no_bf16,
    )
    if gpu:
        # issue 30, goal 4: CPU offload on one GPU, its CPU AdamW step the fused (vectorised, multi-threaded)
        # kernel; NVMe through DeepSpeed, or the one line why not (a row of its own)
        offload = "amp+offload,amp+ckpt+offload,amp+nvme"
        add(
            "gpt_offload",
            "gpt",
            "GPT-2: parameters and optimizer offloaded to the CPU (and NVMe) on one GPU",
            200,
            _tl(
                "gpt",
                "compare",
                "--strategies",
                offload,
                *common,
                "--nproc",
                "1",
                "--micro-batch",
                str(gp.micro_batch),
                "--fused-optimizer",
                "--steps",
                "3",
                "--warmup",
                "1",
                "--timeout",
                "240",
                "--out",
                "{out}",
            ),
            sizes={"model": model, "strategies": offload, "optimizer": "AdamW(fused=True) on the CPU"},
            cannot_run=no_bf16,
        )
    # Last: one build of the model, one row written as each strategy finishes (issue 18).
    add(
        "gpt_planner_error",
        "gpt",
        "GPT-2: the planner's predicted peak memory against the measured one",
        _pick(size, 30, 25, 20),
        _bench(
            "gpt_planner_error.py",
            "--model",
            model,
            "--device",
            dev,
            "--strategies",
            ",".join(gp.planner_error) if gpu else "none,ckpt",
            "--micro-batches",
            "2",
            *(["--fused"] if gpu else []),
            "--name",
            "gpt_planner_error",
            "--out",
            "{out}",
        ),
        sizes={"model": model},
    )
    return steps
