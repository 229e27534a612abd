"""LeNet-5's results: a training run (`trainlab train`'s run directory) and the per-layer profile."""

from __future__ import annotations

import json
from pathlib import Path

from trainlab.data.mnist import NOT_OFFICIAL
from trainlab.errors import UserError
from trainlab.report import format as fmt
from trainlab.report import plots
from trainlab.report.blocks import Block, code, para
from trainlab.report.inputs import ResultFile, TrainingRun
from trainlab.report.sections.common import Ctx, plan_facts, record_blocks, table_from_rows
from trainlab.results.kinds import busy_reason


def gpu_util(run: TrainingRun) -> str:
    g = run.summary.get("gpu") or {}
    if g.get("utilization_mean_pct") is not None:
        return f"{fmt.pct(g['utilization_mean_pct'], 0)} mean, {fmt.pct(g.get('utilization_max_pct'), 0)} max"
    utils = [r["utilization_pct"] for r in run.gpu if r.get("utilization_pct") is not None]
    if utils:
        return f"{fmt.pct(sum(utils) / len(utils), 0)} mean, {fmt.pct(max(utils), 0)} max"
    return fmt.MISSING


def busy_snapshot(env: dict) -> dict | None:
    """The nvidia-smi text taken while the run trained ({"text", "taken_utc"}), if the run has one."""
    busy = env.get("nvidia_smi_busy")
    if isinstance(busy, dict) and isinstance(busy.get("text"), str) and busy["text"].strip():
        return {"text": busy["text"], "taken_utc": str(busy.get("taken_utc") or fmt.MISSING)}
    return None


def device(run: TrainingRun) -> str:
    s = run.summary
    name = s.get("device_name")
    ranks = s.get("world_size") or 1
    par = f" × {ranks} ranks ({s.get('parallel')})" if ranks > 1 else ""
    return f"{s.get('device', fmt.MISSING)}{f' ({name})' if name else ''}{par}"


def time_to_99(s: dict) -> str:
    t = s.get("time_to_99_seconds")
    return fmt.seconds(t) if t is not None else "not reached"


def _facts(run: TrainingRun) -> list[list[str]]:
    s = run.summary
    facts = [
        ("test accuracy", fmt.pct(s.get("test_accuracy"))),
        ("train accuracy (last epoch, running)", fmt.pct(s.get("train_accuracy"))),
        ("test loss", fmt.number(s.get("test_loss"))),
        ("epochs", fmt.count(s.get("epochs"))),
        ("train time", fmt.seconds(s.get("train_seconds"))),
        ("time to 99 %", time_to_99(s)),
        ("warm-up / compilation (not in train time)", fmt.seconds(s.get("warmup_seconds"))),
        ("throughput (median epoch)", fmt.rate(s.get("images_per_s_median"))),
        ("device", device(run)),
        ("GPU utilization", gpu_util(run)),
        ("parameters", fmt.count(s.get("params"))),
        ("activation", s.get("act", fmt.MISSING)),
        ("seed", str(s.get("seed", fmt.MISSING))),
    ]
    return [["", "value"]] + [[k, v] for k, v in facts]


def _environment(env: dict) -> list[Block]:
    gpus = ", ".join(env.get("gpus") or []) or "none"
    blocks = [
        Block("h3", "Environment"),
        para(
            f"python {env.get('python')}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
            f"CPU {env.get('cpu')} × {env.get('cpu_count')}, GPUs: {gpus}, {env.get('time_utc')}"
        ),
    ]
    busy = busy_snapshot(env)
    if busy:
        blocks += [para(f"nvidia-smi during training (taken {busy['taken_utc']}):"), Block("pre", busy["text"])]
    elif env.get("nvidia_smi"):
        blocks.append(para("nvidia-smi at start-up, before training (the run has no snapshot taken during training):"))
        blocks.append(Block("pre", env["nvidia_smi"]))
    return blocks


def _figures(run: TrainingRun, ctx: Ctx, curves: bool) -> list[Block]:
    s, prefix, blocks = run.summary, f"run{ctx.index}_", []
    source = run.path / "summary.json"
    for title, fn in (
        (
            ("Loss", plots.loss_curves),
            ("Accuracy: train (running) and test", plots.accuracy_curve),
            ("GPU", plots.gpu_timeline),
        )
        if curves
        else ()
    ):
        png = ctx.figure(f"{prefix}{fn.__name__}.png", source, lambda path, fn=fn: fn(run, path))
        if png is not None:
            blocks.append(Block("img", title, src=png.name))
        elif title == "GPU":
            blocks.append(Block("note", "No GPU record (gpu.csv) in this run: it ran on the CPU or without NVML."))
        else:
            blocks.append(Block("note", f"No metrics.jsonl: {title.split(':')[0].lower()} curve omitted."))
    if "per_class_accuracy" in s:
        png = ctx.figure(f"{prefix}per_class.png", source, lambda path: plots.per_class_bars(run, path))
        blocks.append(Block("img", "Per-class accuracy", src=png.name))
    if "confusion_matrix" in s:
        png = ctx.figure(f"{prefix}confusion.png", source, lambda path: plots.confusion(run, path))
        blocks.append(Block("img", "Confusion matrix", src=png.name))
    try:
        png = ctx.figure(f"{prefix}misclassified.png", source, lambda path: plots.misclassified_grid(run, path))
    except UserError as e:  # a damaged file costs this figure, with a line saying so, not the report
        png = None
        blocks.append(Block("note", f"{e} — the misclassified digits are not shown"))
    if png is not None:
        blocks.append(Block("img", "Misclassified test images (true→predicted)", src=png.name))
    return blocks


def epoch_table(run: TrainingRun) -> list[list[str]]:
    rows = [["epoch", "train loss", "test loss", "train accuracy", "test accuracy", "throughput", "epoch time"]]
    return rows + [
        [
            str(r["epoch"]),
            fmt.number(r.get("train_loss")),
            fmt.number(r.get("test_loss")),
            fmt.pct(r.get("train_accuracy")),
            fmt.pct(r.get("test_accuracy")),
            fmt.rate(r.get("images_per_s")),
            fmt.seconds(r.get("epoch_seconds")),
        ]
        for r in run.epochs
    ]


def run_section(run: TrainingRun, ctx: Ctx, curves: bool = True) -> list[Block]:
    """A training run's facts, configuration, environment and figures; `curves=False` leaves out the
    loss, accuracy and GPU figures (a page that shows them elsewhere)."""
    s, cfg = run.summary, run.config
    blocks = [Block("h2", f"Training run: {run.name}"), para("Run directory: ", code(ctx.shown(run.path)))]
    facts = plan_facts(run.plan)
    if facts:
        blocks.append(para("Ran with " + "; ".join(facts) + "."))
    busy = busy_reason(run.env.get("load"))
    if busy:
        blocks.append(Block("note", f"Trained on a busy machine ({busy}): its times are not a quiet machine's."))
    blocks.append(Block("table", rows=_facts(run)))
    if NOT_OFFICIAL in str(s.get("data", "")):  # trained on altered data: said where the numbers are
        blocks.append(Block("note", f"Data: {s['data']} — every number of this run is measured on that data"))
    if cfg:
        shown = {k: v for k, v in cfg.items() if v is not None and k not in ("progress", "tensorboard", "out", "name")}
        blocks += [Block("h3", "Configuration"), para(", ".join(f"{k}={fmt.number(v)}" for k, v in shown.items()))]
    if run.env:
        blocks += _environment(run.env)
    blocks += _figures(run, ctx, curves)
    if run.epochs:
        blocks.append(Block("table", rows=epoch_table(run)))
    raw = json.dumps({k: v for k, v in s.items() if k not in ("confusion_matrix", "run_dir")}, indent=1)
    if ctx.root is not None:  # paths inside the lab folder (its data cache) as the folder's own, not the machine's
        for root in {str(Path(ctx.root).resolve()), str(ctx.root)}:
            raw = raw.replace(root + "/", "")
    blocks.append(Block("details", "raw values (summary.json)", body=raw))
    return blocks


PROFILE_COLUMNS = [
    "variant",
    "layer",
    "fwd_ms_median",
    "bwd_ms_median",
    "total_ms_median",
    "fwd_ms_p10",
    "fwd_ms_p90",
    "bwd_ms_p10",
    "bwd_ms_p90",
]


def render(res: ResultFile, ctx: Ctx) -> list[Block]:
    """lenet_profile: ms per training step, medians; rows = variant × part."""
    d = res.data
    return record_blocks(res.path, d, ctx) + [
        para(f"{d.get('steps')} profiled steps per variant (interleaved), batch {d.get('batch_size')}."),
        Block("table", rows=table_from_rows(res.rows, PROFILE_COLUMNS)),
    ]
