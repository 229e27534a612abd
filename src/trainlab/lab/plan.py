"""The lab's GPT-2 rows for the hardware, chosen by the memory planner so that every row fits.

For N GPUs of M bytes and compute capability sm, `plan_gpt` picks:
- the precision: bf16 autocast ("amp") on sm80+, fp16 with a GradScaler below (an RTX 2080 Ti has no
  bf16); pipeline parallelism has no GradScaler (gpt.strategy), so on sm75 it runs in fp32;
- the model: the handout's GPT-2 1.6B, or, where even its single-GPU row cannot fit (11 GB cards), the
  largest GPT-2 preset whose single-GPU row does — the 1-vs-N comparison needs that row;
- one global batch (16 sequences: the same data for every row) and the largest micro-batch of 8, 4, 2,
  1 at which the single-GPU row and as many other rows as at any micro-batch fit;
- the rows: on one GPU amp, fp32 with checkpointing, amp with checkpointing; on N >= 2 the single-GPU
  amp row (same global batch, accumulated) against ddp, zero2, zero3, tp and pp, each with amp — each
  as it is if it fits, else with activation checkpointing (ckpt) if that fits, else left out with the
  planner's number. The planner also decides the attention kernel per sm (no flash below sm80).

- on one GPU, the offload rows (`gpt_offload`): the handout's model where its `amp+ckpt+offload` (fp16
  below sm80) fits, so an 11 GB card still trains GPT-2 1.6B; NVMe through DeepSpeed where it is installed;
- gpt_best: the fastest single-GPU setting with issue 30's levers, at the largest micro-batch the planner
  fits with them: the micro-batch printed is the one the step runs.

Every row is the run `gpt compare` starts (`gpt.config.plan_for_strategy`, the one per-strategy rule).
Every prediction is `gpt.planner.predict_plan` of the run's resolved plan (`gpt.plan.resolve` on a
described `Machine`: the plan `gpt compare` starts, with its per-rank batch, micro-batch, accumulation
and pipeline micro-batches), against `planner.usable_bytes` of the device.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace

from trainlab.errors import ConfigError, HardwareError
from trainlab.gpt.config import GPTBenchConfig, plan_for_strategy
from trainlab.gpt.plan import resolve
from trainlab.gpt.planner import GiB, predict_plan, usable_bytes
from trainlab.gpt.shape import get_preset
from trainlab.gpt.strategy import mesh_rows, parse_strategy
from trainlab.hardware import Machine, amp_for_sm

HANDOUT_MODEL = "gpt2-1.6b"
# the handout's model first; the smaller presets only where its single-GPU row does not fit
MODELS = (HANDOUT_MODEL, "gpt2-large", "gpt2-medium", "gpt2")
GLOBAL_BATCH = 16
MICRO_BATCHES = (8, 4, 2, 1)
OPTIMIZER = "foreach"  # `gpt compare` runs torch's default AdamW on the GPU (no --fused-optimizer)


# issue 30's model levers, on in gpt_best (GPTBenchConfig fields)
LEVERS = dict(vocab_multiple=64, fused_qkv=True, loss="chunked")
# issue 35's glue, on in gpt_best under bf16 (where it was measured): on one H200 at 16 × 1 the four
# together took gpt_best from 45.0 % to 49.2 % MFU, 1.31× the HF peer in the same call
# (benchmarks/results/gpu/h200/2026-11-28/). fp16 (sm75) keeps issue 30's levers: a 16-bit residual
# stream was never run there, and fp16's range is the GradScaler's concern, not this row's.
GLUE_LEVERS = dict(loss="auto", residual_16bit=True, fused_boundary=True, cast_once=True)


def best_levers(precision: str) -> dict:
    """The model levers gpt_best runs with under `precision` (bf16 | fp16 | fp32)."""
    return {**LEVERS, **GLUE_LEVERS} if precision == "bf16" else LEVERS


@dataclass(frozen=True)
class LabGptRow:
    strategy: str
    nproc: int
    micro_batch: int  # on each rank, as `gpt compare` runs it
    predicted_bytes: int  # per device
    attention: str  # the SDPA kernel the planner assumes
    note: str = ""  # why ckpt was added


@dataclass(frozen=True)
class LabGptRows:
    """The lab's GPT-2 rows for one machine (not a `gpt.plan.GPTPlan`: that is one resolved run)."""

    model: str
    gpus: int
    gpu_mem_bytes: int
    usable_bytes: int
    sm: int
    precision: str  # bf16 | fp16
    global_batch: int
    micro_batch: int
    rows: tuple[LabGptRow, ...]  # the `gpt compare` rows
    left_out: tuple[tuple[str, str], ...]  # (strategy, why) for rows that fit in no variant
    best: LabGptRow  # the fastest single-GPU setting (compile + accumulation, the levers), as the step runs it
    baseline: LabGptRow  # the handout's fp32 + checkpointing baseline (HF; our model's prediction)
    planner_error: tuple[str, ...]  # strategies whose prediction is checked against the measured peak
    offload_model: str  # the model of the offload rows (the handout's where it fits with offload)
    offload: tuple[LabGptRow, ...]  # the offload rows that fit (one GPU)
    nvme: str | None  # why the NVMe row cannot run here (DeepSpeed missing), or None
    note: str = ""  # why the model is not the handout's

    @property
    def strategies(self) -> str:
        return ",".join(r.strategy for r in self.rows)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _prediction(model, strategy, gpus, global_batch, micro, sm, optimizer=OPTIMIZER) -> dict:
    """The planner's per-device prediction (`planner.predict_plan`, the one translation of a plan into the
    planner) for one `gpt compare` row: its resolved plan on `gpus` GPUs of compute capability `sm`/10 (a
    described `Machine`: every check `gpt bench` makes there, bf16 below sm80 included), through `gpt
    compare`'s own per-strategy rule. ConfigError where `gpt bench` refuses that run."""
    bench = GPTBenchConfig(
        model=model,
        nproc=gpus,
        global_batch=global_batch,
        micro_batch=micro,
        device="cuda",
        fused_optimizer=optimizer == "fused",
    )
    plan = resolve(plan_for_strategy(bench, strategy), Machine(gpus=gpus, sm=sm))
    return {"nproc": plan.world_size, "micro_batch": plan.micro_batch, **predict_plan(plan)}


def _as_row(strategy: str, pred: dict, note: str = "") -> LabGptRow:
    numbers = (pred["nproc"], pred["micro_batch"], pred["total_bytes"])
    return LabGptRow(parse_strategy(strategy).text, *numbers, pred["attention"]["label"], note)


def _row(model, strategy, gpus, global_batch, micro, sm, budget, optimizer=OPTIMIZER) -> LabGptRow | None:
    """The row if `gpt bench` runs it and it fits `budget`, else None."""
    try:
        pred = _prediction(model, strategy, gpus, global_batch, micro, sm, optimizer)
    except ConfigError:
        return None
    return _as_row(strategy, pred) if pred["total_bytes"] <= budget else None


def _fitting(model, strategy, gpus, global_batch, micro, sm, budget) -> tuple[LabGptRow | None, str]:
    """The row as it is, else with ckpt; (None, why) when neither fits."""
    try:
        plain = _prediction(model, strategy, gpus, global_batch, micro, sm)
    except ConfigError as e:  # a run gpt bench itself refuses here (e.g. 1F1B with fewer micro-batches than stages)
        return None, f"at micro-batch {micro}: {e}"
    if plain["total_bytes"] <= budget:
        return _as_row(strategy, plain), ""
    need = f"{plain['total_bytes'] / GiB:.1f} GiB"
    try:
        ckpt = _prediction(model, strategy + "+ckpt", gpus, global_batch, micro, sm)
    except ConfigError:
        ckpt = None
    if ckpt and ckpt["total_bytes"] <= budget:
        return _as_row(strategy + "+ckpt", ckpt, f"ckpt: {strategy} alone needs {need}"), ""
    with_ckpt = f"{ckpt['total_bytes'] / GiB:.1f} GiB" if ckpt else "not runnable"
    return None, f"needs {need}, {with_ckpt} with ckpt, at micro-batch {micro}; {budget / GiB:.1f} GiB usable"


def wanted_rows(gpus: int, sm: int, n_head: int, n_layer: int = 48) -> list[str]:
    """The rows the lab compares, before the planner decides whether each needs ckpt; on 4+ GPUs also
    data parallelism composed with tp and/or pp on one device mesh (`gpt.strategy.mesh_rows`)."""
    amp = "amp" if amp_for_sm(sm) == "bf16" else "fp16"
    if gpus < 2:
        return [amp, "ckpt", f"{amp}+ckpt"]
    rows = [amp, f"ddp+{amp}", f"zero2+{amp}", f"zero3+{amp}"]
    if n_head % gpus == 0:
        rows.append(f"tp+{amp}")
    rows.append("pp+amp" if amp == "amp" else "pp")  # pp takes no GradScaler: fp32 where bf16 is missing
    shape = SimpleNamespace(n_head=n_head, n_layer=n_layer)
    # fp16's GradScaler is refused beside a mesh's data parallelism: those rows run fp32 below sm80
    rows += [f"{r}+amp" if amp == "amp" else r for r in mesh_rows(gpus, shape)]
    return rows


def plan_gpt(gpus: int, gpu_mem: int, sm: int) -> LabGptRows:
    """The lab's GPT-2 rows for `gpus` devices of `gpu_mem` bytes, compute capability `sm`/10."""
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: expected at least 1")
    budget = usable_bytes(gpu_mem)
    precision = amp_for_sm(sm)
    amp = "amp" if precision == "bf16" else "fp16"
    single = f"{amp}+ckpt"  # the smallest single-GPU row: the model must fit it at micro-batch 1
    model = next((m for m in MODELS if _row(m, single, 1, GLOBAL_BATCH, 1, sm, budget)), None)
    if model is None:
        raise ConfigError(
            f"--gpu-mem {gpu_mem / GiB:.1f} GiB: not even GPT-2 (124M) with {single} at micro-batch 1 "
            f"fits in {budget / GiB:.1f} GiB usable"
        )
    note = (
        ""
        if model == HANDOUT_MODEL
        else (
            f"{HANDOUT_MODEL} does not fit one GPU with {single} at micro-batch 1 "
            f"({_prediction(HANDOUT_MODEL, single, 1, GLOBAL_BATCH, 1, sm)['total_bytes'] / GiB:.1f} GiB, "
            f"{budget / GiB:.1f} GiB usable): {model}, the largest GPT-2 that does"
        )
    )
    wanted = wanted_rows(gpus, sm, get_preset(model).n_head, get_preset(model).n_layer)

    def rows_at(micro):
        fitted = [(s, *_fitting(model, s, gpus, GLOBAL_BATCH, micro, sm, budget)) for s in wanted]
        return [r for _, r, _ in fitted if r], [(s, why) for s, r, why in fitted if r is None]

    # the largest micro-batch at which the single-GPU row fits and as many rows as anywhere
    options = [(m, *rows_at(m)) for m in MICRO_BATCHES]
    options = [o for o in options if o[1] and o[1][0].nproc == 1]
    micro, rows, left_out = max(options, key=lambda o: (len(o[1]), o[0]))
    best = _best(model, amp, sm, gpu_mem)
    baseline = next(r for m in MICRO_BATCHES for r in [_row(model, "ckpt", 1, GLOBAL_BATCH, m, sm, budget)] if r)
    checked = tuple(s for s in (f"{amp}+ckpt", amp, "none") if _row(model, s, 1, 2, 2, sm, budget, "fused"))
    offload_model, offload = _offload(model, amp, sm, budget)
    return LabGptRows(
        model,
        gpus,
        gpu_mem,
        budget,
        sm,
        precision,
        GLOBAL_BATCH,
        micro,
        tuple(rows),
        tuple(left_out),
        best,
        baseline,
        checked,
        offload_model,
        offload,
        None if importlib.util.find_spec("deepspeed") else NVME_MISSING,
        note,
    )


NVME_MISSING = "DeepSpeed is not installed (`pip install .[offload]`): the amp+nvme row records that, with no number"


def _best(model: str, amp: str, sm: int, gpu_mem: int) -> LabGptRow:
    """gpt_best: compile with the levers, as `gpt bench --micro-batch-auto` would choose it on one such GPU
    (gpt.plan.fastest_fitting: every micro-batch, with accumulation and without, every head layout; the
    fastest predicted that fits), stated: the step runs that plan's strategy and micro-batch by name."""
    bench = GPTBenchConfig(
        model=model,
        strategy=f"{amp}+compile+accum",
        global_batch=GLOBAL_BATCH,
        micro_batch_auto=True,
        device="cuda",
        fused_optimizer=True,
        **best_levers("bf16" if amp == "amp" else amp),
    )
    try:
        plan = bench.plan(Machine(gpus=1, sm=sm, memory_bytes=gpu_mem))
    except (ConfigError, HardwareError) as e:
        raise ConfigError(f"gpt_best: {bench.strategy} fits at no micro-batch: {e}") from None
    pred = predict_plan(plan)
    return LabGptRow(plan.strategy.text, 1, plan.micro_batch, pred["total_bytes"], pred["attention"]["label"])


def _offload(model: str, amp: str, sm: int, budget: int) -> tuple[str, tuple[LabGptRow, ...]]:
    """The offload rows at the largest micro-batch where the checkpointed one fits: on the handout's model
    where it fits one GPU at all (the handout names CPU offload for exactly this), else on the lab's model."""
    wanted = (f"{amp}+offload", f"{amp}+ckpt+offload")
    for chosen in dict.fromkeys((HANDOUT_MODEL, model)):
        for m in MICRO_BATCHES:
            if _row(chosen, wanted[1], 1, GLOBAL_BATCH, m, sm, budget, "fused"):
                rows = (_row(chosen, s, 1, GLOBAL_BATCH, m, sm, budget, "fused") for s in wanted)
                return chosen, tuple(r for r in rows if r)
    return model, ()


def format_gpt_plan(p: LabGptRows) -> str:
    """The plan as the lines `trainlab lab --plan` prints under the steps."""
    lines = [
        f"GPT-2 rows (planner: {p.gpus} GPU(s) of {p.gpu_mem_bytes / GiB:.1f} GiB, {p.usable_bytes / GiB:.1f} GiB "
        f"usable, sm{p.sm}; {p.precision} autocast{' with a GradScaler' if p.precision == 'fp16' else ''}): "
        f"model {p.model}, global batch {p.global_batch}, micro-batch {p.micro_batch}"
    ]
    if p.note:
        lines.append(f"  {p.note}")
    lines.append(f"  {'step':<16} {'strategy':<24} {'GPUs':>4} {'micro':>5} {'predicted':>10}  attention")
    baseline = dataclasses.replace(p.baseline, note="HF GPT2LMHeadModel, predicted as our model")
    levers = best_levers(p.precision).items()
    best = dataclasses.replace(p.best, note="with " + ", ".join(f"{k}={v}" for k, v in levers))
    named = [("gpt_best", best), ("gpt_baseline", baseline)] + [("gpt_strategies", r) for r in p.rows]
    named += [("gpt_offload", dataclasses.replace(r, note=p.offload_model)) for r in p.offload]
    for step, r in named:
        lines.append(
            f"  {step:<16} {r.strategy:<24} {r.nproc:>4} {r.micro_batch:>5} {r.predicted_bytes / GiB:>6.1f} GiB"
            f"  {r.attention}{f'  ({r.note})' if r.note else ''}"
        )
    lines += [f"  left out: {s}: {why}" for s, why in p.left_out]
    if p.nvme and p.precision == "bf16":  # the NVMe row is a bf16 row (DeepSpeed's)
        lines.append(f"  gpt_offload: amp+nvme: {p.nvme}")
    lines.append(f"  gpt_planner_error: {','.join(p.planner_error)} at micro-batch 2 (one GPU)")
    return "\n".join(lines)
