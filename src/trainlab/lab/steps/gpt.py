"""GPT-2: the memory plan, our fastest setting, the handout's baseline (TF32 off and on), the strategies
side by side, the ablation, CPU offload, and the planner's error. On a GPU every row is the memory
planner's for this hardware (`lab.plan`): the model, the micro-batch, bf16 or fp16, ckpt where needed."""

from __future__ import annotations

from dataclasses import replace

from trainlab.gpt.ablation import ABLATION_EXCLUDED_BENCH_FLAGS, CHANGES, GLUE, AblationConfig
from trainlab.gpt.config import COMPARE_EXCLUDED_BENCH_FLAGS, CompareConfig, GPTBenchConfig, PlanConfig
from trainlab.gpt.shape import count_params, get_preset
from trainlab.hardware import Machine
from trainlab.lab.plan import HANDOUT_MODEL, LEVERS, OPTIMIZER, LabGptRows, best_levers, plan_gpt
from trainlab.lab.steps.base import Step, pick, script, trainlab
from trainlab.lab.steps.dp import GPU_ONLY
from trainlab.lab.steps.lenet import no_tf32
from trainlab.lab.steps.scripts import PlannerErrorConfig

OFFLOAD_TITLE = "GPT-2: parameters and optimizer offloaded to the CPU (and NVMe) on one GPU"
_NESTED = {"bench": COMPARE_EXCLUDED_BENCH_FLAGS}
CPU_MODEL = "tiny"  # the tiny preset on a CPU; the planner's model (the handout's 1.6B where it fits) on a GPU


def rows_for(hw: Machine) -> LabGptRows:
    return plan_gpt(max(1, hw.gpus), hw.memory_bytes or 80 * 2**30, hw.sm or 90)


def _gpu_seconds(hw: Machine, seconds: float, model: str, bound: str = "compute") -> float:
    """`seconds` measured on the H100 with the handout's model, for `model` on this GPU (work ∝ parameters)."""
    share = count_params(get_preset(model)) / count_params(get_preset(HANDOUT_MODEL))
    return round(hw.scale(seconds * max(share, 0.1), bound))


def steps(hw: Machine, size: str) -> list[Step]:
    gp = rows_for(hw) if hw.gpu else None
    model = gp.model if gp else CPU_MODEL
    shape = dict(model=model, device=hw.device, global_batch=gp.global_batch if gp else 8)
    common = GPTBenchConfig(**shape) if gp else GPTBenchConfig(**shape, seq=64)
    timed = dict(steps=8, warmup=3) if gp else dict(steps=pick(size, 2, 5, 5), warmup=1)
    t = (lambda s, bound="compute": _gpu_seconds(hw, s, model, bound)) if gp else (lambda s, bound=None: s)
    return [
        _plan(hw, gp, size),
        _best(hw, gp, common, timed, pick(size, 20, 20, t(60))),
        *_baselines(hw, gp, common, size, t),
        _strategies(hw, gp, common, size, t),
        _ablation(hw, gp, common, size, t),
        _offload(hw, gp, common),
        # Last: one build of the model, one row written as each strategy finishes (issue 18).
        Step(
            "gpt_planner_error",
            "gpt",
            "GPT-2: the planner's predicted peak memory against the measured one",
            pick(size, 30, 20, 20),
            script(
                PlannerErrorConfig(
                    model=model,
                    device=hw.device,
                    strategies=",".join(gp.planner_error) if gp else "none,ckpt",
                    micro_batches="2",
                    fused=bool(gp),
                    name="gpt_planner_error",
                    out="{out}",
                )
            ),
            sizes={"model": model},
        ),
    ]


def _plan(hw: Machine, gp: LabGptRows | None, size: str) -> Step:
    mem = f"{hw.memory_bytes}B" if hw.memory_bytes else "80GiB"  # --gpu-mem needs a unit
    cfg = PlanConfig(
        model=HANDOUT_MODEL,
        gpus=max(1, hw.gpus),
        gpu_mem=mem,
        micro_batch=gp.micro_batch if gp else 8,
        optimizer=OPTIMIZER,
        sm=hw.sm or 90,
        json="{out}/plan.json",
    )
    return Step(
        "gpt_plan",
        "gpt",
        "GPT-2 1.6B memory plan for this device (every strategy)",
        pick(size, 15, 15, 14),
        trainlab("gpt", "plan", config=cfg),
        sizes={"model": HANDOUT_MODEL, "gpus": cfg.gpus, "memory": mem},
    )


def _best(hw: Machine, gp: LabGptRows | None, common: GPTBenchConfig, timed: dict, estimate: float) -> Step:
    """The planner's fastest single-GPU row with issue 30's levers, at the micro-batch it fits with them
    (lab.plan: the row `--plan` prints is this step's)."""
    if gp:
        tf32 = "on" if not no_tf32(hw) else "off"
        cfg = replace(common, strategy=gp.best.strategy, micro_batch=gp.best.micro_batch, fused_optimizer=True,
                      tf32=tf32, **best_levers(gp.precision), **timed, json="{out}/bench.json")  # fmt: skip
    else:
        cfg = replace(common, strategy="none", micro_batch=4, **LEVERS, **timed, json="{out}/bench.json")
    return Step(
        "gpt_best",
        "gpt",
        "GPT-2: our fastest single-device configuration",
        # 37.5 s on the H100 as amp+compile+accum at micro-batch 8; the levers since (not yet measured: the
        # compile dominates, as before)
        estimate,
        trainlab("gpt", "bench", config=cfg),
        sizes={
            "model": cfg.model,
            "strategy": cfg.strategy,
            "micro_batch": cfg.micro_batch,
            **({"predicted_gib": round(gp.best.predicted_bytes / 2**30, 1)} if gp else {}),
        },
    )


def _baselines(hw: Machine, gp: LabGptRows | None, common: GPTBenchConfig, size: str, t) -> list[Step]:
    """The handout's baseline (HF GPT2LMHeadModel, fp32, checkpointing), TF32 off, and on beside it (report
    000's trick). Its limit is generous: fp32 on the GPU is ~6x slower per step than bf16, and the old
    suite's 150 s cut it off (issue 18); 51 s on an H100, an A100's fp32 rate is a third of it."""
    timed = dict(steps=4, warmup=1) if gp else dict(steps=pick(size, 2, 5, 5), warmup=1)
    micro = gp.baseline.micro_batch if gp else 4
    out = []
    for tf32, name, title, est in (
        ("off", "gpt_baseline", "GPT-2: the handout's baseline (HF GPT2LMHeadModel, fp32, checkpointing)", 50),
        ("on", "gpt_baseline_tf32", "GPT-2: the handout's baseline with TF32 on", 45),
    ):
        cfg = replace(
            common, impl="hf", strategy="ckpt", tf32=tf32, micro_batch=micro, **timed, json="{out}/bench.json"
        )
        estimate = pick(size, 35, 20, t(est, "fp32" if tf32 == "off" else "compute")) if tf32 == "off" or gp else 0
        out.append(
            Step(
                name,
                "gpt",
                title,
                estimate,
                trainlab("gpt", "bench", config=cfg),
                sizes={"model": cfg.model, "impl": "hf", "strategy": "ckpt", "tf32": tf32},
                cannot_run=no_tf32(hw) if tf32 == "on" else None,
                min_limit_s=300,
            )
        )
    return out


def _strategies(hw: Machine, gp: LabGptRows | None, common: GPTBenchConfig, size: str, t) -> Step:
    strategies = gp.strategies if gp else pick(size, "none,ddp", "none,ckpt,ddp,zero3,tp,pp", "")
    nproc = (hw.gpus if hw.gpus > 1 else 1) if gp else 2
    timed = dict(steps=3, warmup=1) if gp else dict(steps=pick(size, 2, 5, 5), warmup=1)
    bench = replace(common, nproc=nproc, micro_batch=gp.micro_batch if gp else 4, **timed)
    cfg = CompareConfig(bench=bench, strategies=strategies, timeout_s=240.0, out="{out}")
    # full: 25 s a row on the H100 (74.7 s for 3 rows in the lab run of 2026-11-25); 40 s a row on several
    # GPUs leaves room for the slower A100 and the process groups' start-up
    estimate = pick(size, 60, 30, 20 + t(25 if hw.gpus <= 1 else 40) * len(gp.rows) if gp else 200)
    return Step(
        "gpt_strategies",
        "gpt",
        "GPT-2: parallel and memory strategies side by side, on the same data",
        estimate,
        trainlab("gpt", "compare", config=cfg, nested=_NESTED),
        sizes={
            "model": bench.model,
            "strategies": strategies,
            "ranks": nproc,
            **(
                {
                    "global_batch": gp.global_batch,
                    "micro_batch": gp.micro_batch,
                    "precision": gp.precision,
                    "predicted_gib": {r.strategy: round(r.predicted_bytes / 2**30, 1) for r in gp.rows},
                    "left_out": dict(gp.left_out),
                    **({"model_note": gp.note} if gp.note else {}),
                }
                if gp
                else {}
            ),
        },
    )


def ablation_changes(hw: Machine, size: str) -> tuple[str, str]:
    """(changes, groups) of `gpt ablation` here: in fp16 with a GradScaler below sm80, without TF32 (none
    there) and the peer row (bf16); tiny and small: a few changes on the tiny model."""
    if size != "full":
        # no tf32 on a CPU: a "+ TF32 on" row there would measure nothing it names
        return pick(size, "ours,vocab-pad", "ours,bf16,vocab-pad,chunked-ce,max-micro-batch", ""), pick(
            size, "baseline,cumulative", AblationConfig().groups, ""
        )
    # to gpt_best's issue-30 levers: the glue (in gpt_best under bf16) is 4 rows more than the step's
    # 9-minute call holds; benchmarks/gpu_gpt.py --parts glue measures those rows
    names = [c.name for c in CHANGES if c.name not in GLUE]
    if hw.half == "fp16":
        names = [{"bf16": "fp16"}.get(n, n) for n in names if n != "tf32"]
        return ",".join(names), "baseline,cumulative,separate"
    return ",".join(names), "baseline,cumulative,peer,separate"


def _ablation(hw: Machine, gp: LabGptRows | None, common: GPTBenchConfig, size: str, t) -> Step:
    """Issue 30: from the handout's baseline to gpt_best, each change alone and cumulatively, and the peer
    row, every row on the same tokens (issue 35's glue levers, the last of gpt_best's, not here:
    benchmarks/gpu_gpt.py --parts glue measures them). full: the baseline, the 10 cumulative rows and the peer, ~12 runs
    of 25-60 s on an H100 (estimated, not yet measured; compile rows reuse inductor's on-disk cache)."""
    changes, groups = ablation_changes(hw, size)
    timed = dict(steps=4, warmup=1) if gp else dict(steps=pick(size, 2, 5, 5), warmup=1)
    bench = replace(common, micro_batch=gp.micro_batch if gp else 4, **timed)
    cfg = AblationConfig(bench=bench, changes=changes, groups=groups, timeout_s=300.0, out="{out}")
    return Step(
        "gpt_ablation",
        "gpt",
        "GPT-2: the speed-up broken down, from the handout's baseline to ours, and a peer",
        pick(size, 30, 30, t(450)),
        trainlab("gpt", "ablation", config=cfg, nested={"bench": ABLATION_EXCLUDED_BENCH_FLAGS}),
        sizes={
            "model": bench.model,
            "changes": changes,
            "groups": groups,
            "precision": hw.half or "fp32",
            "tokens_per_row": "global batch × seq × steps",
        },
    )


def _offload(hw: Machine, gp: LabGptRows | None, common: GPTBenchConfig) -> Step:
    """Issue 30, goal 4: CPU offload on one GPU, its CPU AdamW step the fused (vectorised, multi-threaded)
    kernel, on the handout's model where the planner fits it; NVMe through DeepSpeed (bf16), or the one
    line why not (a row of its own)."""
    if gp is None:  # listed on a CPU to say why not
        cfg = CompareConfig(bench=common, strategies="amp+offload,amp+ckpt+offload", out="{out}")
        return Step("gpt_offload", "gpt", OFFLOAD_TITLE, 0, trainlab("gpt", "compare", config=cfg, nested=_NESTED),
                    cannot_run=GPU_ONLY + "offload moves a GPU's parameters and optimizer state to the CPU")  # fmt: skip
    rows = [r.strategy for r in gp.offload] + (["amp+nvme"] if hw.half == "bf16" else [])
    micro = gp.offload[0].micro_batch if gp.offload else 1
    bench = replace(common, model=gp.offload_model, nproc=1, micro_batch=micro, fused_optimizer=True, steps=2, warmup=1)
    # the whole comparison within its own budget (each row's limit is cut to the time left, `gpt compare
    # --budget`), so the step fits one call of the default budget beside the rest of the GPT part
    seconds = _gpu_seconds(hw, 140, gp.offload_model, "memory")
    cfg = CompareConfig(bench=bench, strategies=",".join(rows), timeout_s=240.0, budget_s=seconds, out="{out}")
    return Step(
        "gpt_offload",
        "gpt",
        OFFLOAD_TITLE,
        seconds,
        trainlab("gpt", "compare", config=cfg, nested=_NESTED),
        sizes={
            "model": gp.offload_model,
            "strategies": cfg.strategies,
            "optimizer": "AdamW(fused=True) on the CPU",
            **({"nvme": gp.nvme} if gp.nvme and hw.half == "bf16" else {}),
        },
        cannot_run=None if rows else f"no offload row fits {gp.usable_bytes / 2**30:.1f} GiB usable",
    )
