"""Build the report: inputs → a list of blocks → index.html and report.md (same content, two renderings).

The page opens with a one-screen summary (accuracy, time, time-to-99 %, throughput, device, GPU
utilization and its figure when a run has one), then the comparison of groups of runs (a sweep: mean ±
sd over seeds, one plot per swept flag), then each run and each result file. Numbers are formatted for
people (`report.format`: 99.33 %, 25.5 s, 12,822 img/s); every number is read from an input file, and
each run's section keeps its summary.json values unrounded in a "raw values" block.

Sections are functions returning blocks, so a new input kind adds a section without touching the others.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from trainlab.data.mnist import NOT_OFFICIAL
from trainlab.errors import UserError
from trainlab.io import atomic_write_text
from trainlab.report import format as fmt
from trainlab.report import markdown as md
from trainlab.report import plots
from trainlab.report.ablation import ablation_blocks
from trainlab.report.blocks import Block, code, link, para
from trainlab.report.groups import group_runs, series_for
from trainlab.report.inputs import ResultFile, TrainingRun, load_inputs
from trainlab.telemetry.results import DP_COMPARE_COLUMNS

# What the |Δloss| and gradient-MSE columns of `gelu check` measure (ops/check.py, _gelu_recipe)
GELU_RECIPE_NOTE = (
    "|Δloss| and gradient MSE: the handout's check (§4.2.1). A = torch.randn(100) and a target "
    "c = torch.randn(100) go through F.gelu and through this implementation in the row's dtype; "
    "|Δloss| is the difference of the two MSE losses against c, gradient MSE the mean squared "
    "difference of the two input gradients."
)

# Above this many runs the summary shows groups (mean ± sd) instead of one row per run.
SUMMARY_MAX_RUN_ROWS = 12


def _gpu_util(run: TrainingRun) -> str:
    g = run.summary.get("gpu") or {}
    if g.get("utilization_mean_pct") is not None:
        return f"{fmt.pct(g['utilization_mean_pct'], 0)} mean, {fmt.pct(g.get('utilization_max_pct'), 0)} max"
    if run.gpu:
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


def _device(run: TrainingRun) -> str:
    s = run.summary
    name = s.get("device_name")
    dev = s.get("device", fmt.MISSING)
    ranks = s.get("world_size") or 1
    par = f" × {ranks} ranks ({s.get('parallel')})" if ranks > 1 else ""
    return f"{dev}{f' ({name})' if name else ''}{par}"


def _time_to_99(s: dict) -> str:
    t = s.get("time_to_99_seconds")
    return fmt.seconds(t) if t is not None else "not reached"


# ------------------------------------------------------------------------------------ sections


def summary_section(runs: list[TrainingRun], results: list[ResultFile], out: Path) -> list[Block]:
    """The first screen: what a reader wants before any detail."""
    blocks = [Block("h2", "Summary")]
    if runs:
        keys, groups = group_runs(runs)
        if len(runs) <= SUMMARY_MAX_RUN_ROWS:
            rows = [
                [
                    "run",
                    "test accuracy",
                    "train accuracy",
                    "train time",
                    "time to 99 %",
                    "throughput",
                    "device",
                    "GPU utilization",
                ]
            ]
            rows += [
                [
                    r.name,
                    fmt.pct(r.summary.get("test_accuracy")),
                    fmt.pct(r.summary.get("train_accuracy")),
                    fmt.seconds(r.summary.get("train_seconds")),
                    _time_to_99(r.summary),
                    fmt.rate(r.summary.get("images_per_s_median")),
                    _device(r),
                    _gpu_util(r),
                ]
                for r in runs
            ]
        else:
            rows = _group_rows(groups)
        blocks.append(Block("table", rows=rows))
        with_gpu = next((r for r in runs if r.gpu), None)
        if with_gpu is not None:
            png = plots.gpu_timeline(with_gpu, out / "summary_gpu_timeline.png")
            blocks.append(
                Block("img", f"GPU utilization and memory during {with_gpu.name} (NVML, ~10 Hz)", src=png.name)
            )
        if len(groups) > 1:
            blocks.append(
                para(
                    f"{len(runs)} runs in {len(groups)} groups by {', '.join(keys)}: see ",
                    link("Comparison", "comparison"),
                    ".",
                )
            )
    if results:
        pieces: list = ["Result files: "]
        for i, r in enumerate(results):
            pieces += [", " if i else "", code(r.path.name), f" ({r.kind.replace('_', ' ')})"]
        blocks.append(para(*pieces, "."))
    return blocks


def _group_rows(groups) -> list[list[str]]:
    rows = [
        [
            "group",
            "runs (seeds)",
            "test accuracy, mean ± sd",
            "min",
            "max",
            "reached 99 %",
            "time to 99 % (median)",
            "train time (median)",
            "throughput (median)",
        ]
    ]
    for g in groups:
        mean, sd = g.mean_sd("test_accuracy")
        accs = g.stat("test_accuracy")
        t99 = sorted(g.stat("time_to_99_seconds"))
        rows.append(
            [
                g.label,
                f"{len(g.members)} ({', '.join(str(s) for s in g.seeds)})",
                fmt.pct_sd(mean, sd),
                fmt.pct(min(accs)) if accs else fmt.MISSING,
                fmt.pct(max(accs)) if accs else fmt.MISSING,
                f"{len(t99)} of {len(g.members)}",
                fmt.seconds(_median(t99)),
                fmt.seconds(_median(g.stat("train_seconds"))),
                fmt.rate(_median(g.stat("images_per_s_median"))),
            ]
        )
    return rows


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def comparison_section(runs: list[TrainingRun], out: Path) -> list[Block]:
    """Runs grouped by what differs between them (a sweep's flags): mean ± sd over seeds, and for each
    differing flag a plot of test accuracy against its values."""
    if len(runs) < 2:
        return []
    keys, groups = group_runs(runs)
    blocks = [Block("h2", "Comparison", anchor="comparison")]
    if keys:
        pieces: list = ["Runs grouped by "]
        for i, k in enumerate(keys):
            pieces += [", " if i else "", code(k)]
        blocks.append(para(*pieces, "; statistics over the seeds of each group (sd: sample standard deviation)."))
    else:
        blocks.append(para("All runs share one configuration; statistics over their seeds."))
    blocks.append(Block("table", rows=_group_rows(groups)))
    for key in keys:
        series = series_for(key, keys, groups)
        # A plot only for a real sweep axis: some line must hold two values of this key with the other
        # flags fixed. Mixed runs differing in many flags at once make lines of one point each (n = 1).
        if not any(len(points) >= 2 for points in series.values()):
            continue
        png = plots.sweep_lines(key, series, out / f"compare_{_slug(key)}.png")
        blocks.append(Block("img", f"Test accuracy against {key} (mean ± sd over seeds)", src=png.name))
    return blocks


def _figure(path: Path, source: Path | None, draw) -> Path | None:
    """`draw(path)`, unless a `source` is given and `path` is newer than it: `trainlab lab` rebuilds
    its report after every step into its own folder, where a figure's name always stands for the same
    step output, and a finished output does not change (drawing every figure again took ~25 s per step
    on a loaded 2-core box). A one-off `trainlab report` passes no source: it always draws."""
    if source is None:
        return draw(path)
    try:
        if path.stat().st_mtime >= source.stat().st_mtime:
            return path
    except OSError:
        pass  # not drawn yet, or no source to compare with: draw
    return draw(path)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def run_section(
    run: TrainingRun, out: Path, index: int, reuse_figures: bool = False, curves: bool = True
) -> list[Block]:
    """A training run's facts, configuration, environment and figures; `curves=False` leaves out the
    loss, accuracy and GPU figures (a page that shows them elsewhere)."""
    s, cfg, env = run.summary, run.config, run.env
    blocks = [Block("h2", f"Training run: {run.name}"), para("Run directory: ", code(run.path))]
    facts = [
        ("test accuracy", fmt.pct(s.get("test_accuracy"))),
        ("train accuracy (last epoch, running)", fmt.pct(s.get("train_accuracy"))),
        ("test loss", fmt.number(s.get("test_loss"))),
        ("epochs", fmt.count(s.get("epochs"))),
        ("train time", fmt.seconds(s.get("train_seconds"))),
        ("time to 99 %", _time_to_99(s)),
        ("warm-up / compilation (not in train time)", fmt.seconds(s.get("warmup_seconds"))),
        ("throughput (median epoch)", fmt.rate(s.get("images_per_s_median"))),
        ("device", _device(run)),
        ("GPU utilization", _gpu_util(run)),
        ("parameters", fmt.count(s.get("params"))),
        ("activation", s.get("act", fmt.MISSING)),
        ("seed", str(s.get("seed", fmt.MISSING))),
    ]
    blocks.append(Block("table", rows=[["", "value"]] + [[k, v] for k, v in facts]))
    if NOT_OFFICIAL in str(s.get("data", "")):  # trained on altered data: said where the numbers are
        blocks.append(Block("note", f"Data: {s['data']} — every number of this run is measured on that data"))
    if cfg:
        shown = {k: v for k, v in cfg.items() if v is not None and k not in ("progress", "tensorboard", "out", "name")}
        blocks.append(Block("h3", "Configuration"))
        blocks.append(para(", ".join(f"{k}={fmt.number(v)}" for k, v in shown.items())))
    if env:
        blocks.append(Block("h3", "Environment"))
        gpus = ", ".join(env.get("gpus") or []) or "none"
        blocks.append(
            para(
                f"python {env.get('python')}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
                f"CPU {env.get('cpu')} × {env.get('cpu_count')}, GPUs: {gpus}, {env.get('time_utc')}"
            )
        )
        busy = busy_snapshot(env)
        if busy:
            blocks.append(para(f"nvidia-smi during training (taken {busy['taken_utc']}):"))
            blocks.append(Block("pre", busy["text"]))
        elif env.get("nvidia_smi"):
            blocks.append(
                para("nvidia-smi at start-up, before training (the run has no snapshot taken during training):")
            )
            blocks.append(Block("pre", env["nvidia_smi"]))
    prefix = f"run{index}_"
    source = run.path / "summary.json" if reuse_figures else None
    for title, fn in (
        (
            ("Loss", plots.loss_curves),
            ("Accuracy: train (running) and test", plots.accuracy_curve),
            ("GPU", plots.gpu_timeline),
        )
        if curves
        else ()
    ):
        png = _figure(out / f"{prefix}{fn.__name__}.png", source, lambda path, fn=fn: fn(run, path))
        if png is not None:
            blocks.append(Block("img", title, src=png.name))
        elif title == "GPU":
            blocks.append(Block("note", "No GPU record (gpu.csv) in this run: it ran on the CPU or without NVML."))
        else:
            blocks.append(Block("note", f"No metrics.jsonl: {title.split(':')[0].lower()} curve omitted."))
    if "per_class_accuracy" in s:
        png = _figure(out / f"{prefix}per_class.png", source, lambda path: plots.per_class_bars(run, path))
        blocks.append(Block("img", "Per-class accuracy", src=png.name))
    if "confusion_matrix" in s:
        png = _figure(out / f"{prefix}confusion.png", source, lambda path: plots.confusion(run, path))
        blocks.append(Block("img", "Confusion matrix", src=png.name))
    try:
        png = _figure(out / f"{prefix}misclassified.png", source, lambda path: plots.misclassified_grid(run, path))
    except UserError as e:  # a damaged file costs this figure, with a line saying so, not the report
        png = None
        blocks.append(Block("note", f"{e} — the misclassified digits are not shown"))
    if png is not None:
        blocks.append(Block("img", "Misclassified test images (true→predicted)", src=png.name))
    if run.epochs:
        rows = [["epoch", "train loss", "test loss", "train accuracy", "test accuracy", "throughput", "epoch time"]]
        rows += [
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
        blocks.append(Block("table", rows=rows))
    raw = {k: v for k, v in s.items() if k not in ("confusion_matrix",)}
    blocks.append(Block("details", "raw values (summary.json)", body=json.dumps(raw, indent=1)))
    return blocks


DP_COMPILE_NOTE = (
    "Step time: each step synchronized on its own (median). Queued / finished: the same steps run "
    "back to back, timed without and with a final synchronize — what the host queued against what the "
    "GPU finished. Throughput = batch / finished ms per step, the rate of training's back-to-back steps."
)


def dp_compile_table(rows: list[dict]) -> list[list[str]]:
    """benchmarks/dp_compile.py's rows. The throughput is computed from the column beside it (batch /
    synced ms per step): the file's own images_per_s was batch / the median of singly synchronized
    steps before that script was fixed, which matches neither timing column shown."""
    table = [
        [
            "variant",
            "batch",
            "compile / capture",
            "step time (median, each synchronized)",
            "queued ms/step (no sync)",
            "finished ms/step (synced)",
            "throughput (batch / finished)",
        ]
    ]
    for r in rows:
        step = r.get("step_ms") if isinstance(r.get("step_ms"), dict) else {}
        batch, synced = r.get("batch_size"), r.get("synced_ms_per_step")
        tput = batch / (synced / 1e3) if fmt.is_number(batch) and fmt.is_number(synced) and synced > 0 else None
        table.append(
            [
                str(r.get("variant")),
                fmt.value("batch", batch),
                fmt.value("setup_seconds", r.get("setup_seconds")),
                fmt.millis(step.get("median")),
                fmt.millis(r.get("unsynced_ms_per_step")),
                fmt.millis(synced),
                fmt.rate(tput),
            ]
        )
    return table


def table_from_rows(rows: list[dict], preferred: list[str]) -> list[list[str]]:
    """The preferred columns that the rows have, in that order, one table row per input row, each
    value formatted by what its key says it is."""
    keys = [k for k in preferred if any(k in r for r in rows)]
    return [[fmt.header(k) for k in keys]] + [[fmt.value(k, r.get(k)) for k in keys] for r in rows]


def result_section(res: ResultFile, out: Path, index: int, reuse_figures: bool = False) -> list[Block]:
    rows = res.rows
    title = {
        "gelu_check": "GELU correctness (trainlab gelu check)",
        "gelu_bench": "GELU speed (trainlab gelu bench)",
        "dp_compare": "Data-parallel comparison (trainlab dp compare)",
        "gpt_bench": "GPT benchmark (trainlab gpt bench)",
        "gpt_plan": "GPT memory plan (trainlab gpt plan)",
        "gpt_compare": "GPT strategy comparison (trainlab gpt compare)",
        "lenet_profile": "LeNet-5 per-layer profile (trainlab profile)",
        "ops_check": "Layer operators vs ATen (trainlab ops check)",
        "ops_bench": "Layer operators, time per LeNet-5 layer (trainlab ops bench)",
        "dp_compile": "LeNet-5 step: eager, torch.compile and CUDA graphs (benchmarks/dp_compile.py)",
        "gpt_ablation": "GPT-2: the speed-up broken down, from the handout's baseline",
    }[res.kind]
    if res.kind == "dp_compare" and res.path.name.endswith(".loaders.json"):
        title = "DataLoader workers study (trainlab dp compare --workers)"
    blocks = [Block("h2", title), para("Source: ", code(res.path))]
    if res.kind == "gelu_check":
        # A row that could not run here (no GPU, no Triton) is "skipped", never "ok" (older files: ok + skipped)
        # ops check rows keep a case's own checks (the handout's recipe) under "checks"
        rows = [
            {
                **r,
                **(r.get("checks") if isinstance(r.get("checks"), dict) else {}),
                "status": "skipped: " + str(r.get("reason"))
                if r.get("skipped")
                else r.get("status") or ("ok" if r.get("ok") else "FAIL"),
            }
            for r in rows
        ]
        failed = [r for r in rows if r["status"] == "FAIL"]
        skipped = [r for r in rows if r["status"].startswith("skipped")]
        blocks.append(
            para(
                f"{len(rows)} rows: {len(rows) - len(failed) - len(skipped)} ok, {len(failed)} failing, "
                f"{len(skipped)} skipped (could not run on the machine that made the file)."
            )
        )
        blocks.append(
            Block(
                "table",
                rows=table_from_rows(
                    rows,
                    [
                        "case",
                        "impl",
                        "approximate",
                        "dtype",
                        "fwd_max_abs_err",
                        "grad_max_abs_err",
                        "recipe_loss_diff",
                        "recipe_grad_mse",
                        "gradcheck",
                        "gradgradcheck",
                        "status",
                    ],
                ),
            )
        )
        if any("recipe_loss_diff" in r for r in rows):
            blocks.append(para(GELU_RECIPE_NOTE))
    elif res.kind == "gelu_bench":
        blocks.append(
            Block(
                "table",
                rows=table_from_rows(
                    rows,
                    [
                        "size",
                        "impl",
                        "pass",
                        "dtype",
                        "approximate",
                        "median_s",
                        "p10_s",
                        "p90_s",
                        "gbps",
                        "ratio_to_torch",
                        "pct_of_copy_bw",
                    ],
                ),
            )
        )
    elif res.kind == "dp_compare":
        blocks.append(
            Block(
                "table",
                rows=table_from_rows(rows, list(DP_COMPARE_COLUMNS)),
            )
        )
        if any(r.get("busbw_gbps") is not None for r in rows):
            blocks.append(
                para(
                    "Gradient all-reduce against the 2(W−1)/W·S/B bound (S gradient bytes, B measured link bandwidth):"
                )
            )
            blocks.append(
                Block(
                    "table",
                    rows=table_from_rows(
                        [r for r in rows if r.get("busbw_gbps") is not None],
                        [
                            "mode",
                            "world_size",
                            "grad_bytes",
                            "bytes_sent_per_step",
                            "allreduce_ms",
                            "bound_comm_ms",
                            "algbw_gbps",
                            "busbw_gbps",
                            "link_gbps",
                            "busbw_pct_of_link",
                        ],
                    ),
                )
            )
        labels = [
            f"{r.get('mode')}×{r.get('world_size')}" + (f" w{r['workers']}" if r.get("workers") is not None else "")
            for r in rows
        ]
        png = _figure(
            out / f"result{index}_dp.png",
            res.path if reuse_figures else None,
            lambda path: plots.bars(
                labels, [float(r.get("images_per_s") or 0) for r in rows], path, "Throughput by mode", "images/s"
            ),
        )
        blocks.append(Block("img", "Throughput by mode", src=png.name))
    elif res.kind == "dp_compile":
        blocks.append(Block("table", rows=dp_compile_table(rows)))
        blocks.append(para(DP_COMPILE_NOTE))
    elif res.kind == "gpt_ablation":
        blocks += ablation_blocks(res.data)
    elif res.kind == "gpt_bench":
        d = res.data
        blocks.append(
            Block(
                "table",
                rows=[["metric", "value"]]
                + [
                    [fmt.header(k), fmt.value(k, d[k])]
                    for k in (
                        "strategy",
                        "world_size",
                        "params",
                        "step_seconds_median",
                        "tokens_per_s",
                        "tflops_per_device",
                        "mfu",
                        "peak_memory_bytes",
                    )
                    if k in d
                ],
            )
        )
        if d.get("losses"):
            blocks.append(para("losses: " + ", ".join(fmt.number(x) for x in d["losses"])))
    elif res.kind == "gpt_plan":
        d = res.data
        blocks.append(para(f"model params: {fmt.count(d.get('params'))}"))
        blocks.append(
            Block(
                "table",
                rows=table_from_rows(
                    rows,
                    [
                        "strategy",
                        "params_bytes",
                        "grads_bytes",
                        "optimizer_bytes",
                        "activations_bytes",
                        "total_bytes",
                        "fits",
                        "max_micro_batch",
                    ],
                ),
            )
        )
    elif res.kind == "lenet_profile":  # ms per training step, medians; rows = variant x part
        blocks.append(
            para(
                f"{res.data.get('steps')} profiled steps per variant (interleaved), batch "
                f"{res.data.get('batch_size')}, device {res.data.get('device')}; trace: {res.data.get('trace')}"
            )
        )
        blocks.append(
            Block(
                "table",
                rows=table_from_rows(
                    rows,
                    [
                        "variant",
                        "layer",
                        "fwd_ms_median",
                        "bwd_ms_median",
                        "total_ms_median",
                        "fwd_ms_p10",
                        "fwd_ms_p90",
                        "bwd_ms_p10",
                        "bwd_ms_p90",
                    ],
                ),
            )
        )
    elif res.kind == "ops_check":
        failed = [r for r in rows if r.get("ok") is False]
        blocks.append(para(f"{len(rows)} rows, {len(failed)} failing."))
        blocks.append(
            Block(
                "table",
                rows=table_from_rows(
                    rows,
                    ["op", "case", "impl", "dtype", "fwd_max_abs_err", "grad_max_abs_err", "worst_ratio_to_tol", "ok"],
                ),
            )
        )
    elif res.kind == "ops_bench":
        blocks.append(
            Block(
                "table",
                rows=table_from_rows(
                    rows,
                    [
                        "batch",
                        "layer",
                        "impl",
                        "fwd_median_s",
                        "fwd_ratio_to_aten",
                        "bwd_median_s",
                        "bwd_ratio_to_aten",
                    ],
                ),
            )
        )
    elif res.kind == "gpt_compare":
        # speed-up: throughput over the first strategy's (`none` when the matrix has it), as the handout's table wants
        ref_row = next((r for r in rows if r.get("strategy") == "none"), rows[0] if rows else {})
        ref = ref_row.get("tokens_per_s")
        rows = [
            {
                **r,
                "speedup": f"{r['tokens_per_s'] / ref:.2f}× vs {ref_row.get('strategy')}"
                if isinstance(ref, (int, float)) and ref > 0 and isinstance(r.get("tokens_per_s"), (int, float))
                else None,
            }
            for r in rows
        ]
        blocks.append(
            Block(
                "table",
                rows=table_from_rows(
                    rows,
                    [
                        "strategy",
                        "nproc",
                        "status",
                        "step_ms_median",
                        "tokens_per_s",
                        "speedup",
                        "tflops_per_device",
                        "mfu",
                        "peak_tensor_bytes",
                        "predicted_bytes",
                        "first_loss_diff_vs_none",
                    ],
                ),
            )
        )
        ok = [r for r in rows if r.get("tokens_per_s")]
        if ok:
            png = _figure(
                out / f"result{index}_gpt_tps.png",
                res.path if reuse_figures else None,
                lambda path: plots.bars(
                    [r["strategy"] for r in ok],
                    [r["tokens_per_s"] for r in ok],
                    path,
                    "GPT throughput per strategy",
                    "tokens/s",
                ),
            )
            blocks.append(Block("img", "Throughput per strategy", src=png.name))
            key = "peak_tensor_bytes" if any(r.get("peak_tensor_bytes") for r in ok) else "peak_memory_bytes"
            mem = [r for r in ok if r.get(key)]
            if mem:
                png = _figure(
                    out / f"result{index}_gpt_mem.png",
                    res.path if reuse_figures else None,
                    lambda path: plots.bars(
                        [r["strategy"] for r in mem],
                        [r[key] / 2**30 for r in mem],
                        path,
                        f"Peak memory per strategy ({fmt.header(key)}, GiB)",
                        "GiB",
                    ),
                )
                blocks.append(Block("img", "Peak memory per strategy", src=png.name))
    return blocks


# ------------------------------------------------------------------------------------ rendering

CSS = """body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222;overflow-wrap:break-word}
.scroll{max-width:100%;overflow-x:auto}table{border-collapse:collapse;margin:.6em 0;font-size:.9em}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}img{max-width:100%;height:auto;display:block;margin:.5em 0}
.note{color:#8a6d3b;background:#fcf8e3;padding:.3em .6em}.status{color:#555;font-style:italic}
pre{background:#f6f6f6;padding:.6em;font-size:.8em;margin:0}code{overflow-wrap:anywhere}
figure{margin:0}figcaption{font-size:.85em;color:#555}ul.toc{columns:2}
.row{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:1em;align-items:start}
.row>*{min-width:0}.row pre{font-size:.6em}table.text td,table.text th{text-align:left}
td{white-space:nowrap}table.text td,td:first-child{white-space:normal}
details.fold{margin:.4em 0;border-left:3px solid #ddd;padding-left:.6em}details.fold>summary{cursor:pointer;color:#245}
h5{font-size:.95em;margin:.8em 0 .3em}
@media print{details.fold{border:0;padding:0}}"""


def _template():
    import jinja2
    import markupsafe

    from trainlab.text import shown

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("trainlab.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        # the text gate: a value's control characters and lone surrogates (a folder name that is not
        # UTF-8) shown as escapes; markup the code built (Markup) passes as is
        finalize=lambda v: shown(v, lines=True) if isinstance(v, str) and not isinstance(v, markupsafe.Markup) else v,
    )
    return env.get_template("page.html.j2")


def to_html(blocks: list[Block], title: str) -> str:
    """The page, through an autoescaping Jinja2 template: every value arriving in a block (a config
    value, a device name, a path, a loss) is text, whatever it contains."""
    return _template().render(blocks=blocks, title=title, css=CSS)


def to_markdown(blocks: list[Block]) -> str:
    """report.md: the same blocks, every value escaped for Markdown (`report.markdown`), as the page's are for HTML."""
    lines = []
    for b in blocks:
        if b.kind == "fold":
            lines += [
                f"<details><summary>{md.html_text(b.text)}</summary>",
                "",
                to_markdown(b.children),
                "</details>",
                "",
            ]
        elif b.kind == "row":
            lines += [to_markdown(b.children)]
        elif b.kind in ("h1", "h2", "h3", "h4", "h5"):
            lines += ["#" * int(b.kind[1]) + " " + md.text(b.text), ""]
        elif b.kind == "p":
            lines += [
                "".join(
                    md.code(t) if k == "code" else md.text(t, line_start=i == 0)
                    for i, (k, t, _) in enumerate(b.segments)
                ),
                "",
            ]
        elif b.kind in ("note", "status"):
            lines += [f"> {md.text(b.text, line_start=True)}", ""]
        elif b.kind == "pre":
            lines += [*md.fence(b.text), ""]
        elif b.kind == "img":
            lines += [f"![{md.text(b.text)}]({md.link_target(b.src)})", ""]
        elif b.kind == "toc":
            lines += [f"- {md.text(text, line_start=True)}" for text, _ in b.links] + [""]
        elif b.kind == "details":
            lines += [f"<details><summary>{md.html_text(b.text)}</summary>", "", *md.fence(b.body), "</details>", ""]
        elif b.kind == "table":
            head, *body = b.rows
            lines.append("| " + " | ".join(md.text(c) for c in head) + " |")
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(md.text(c) for c in row) + " |" for row in body]
            lines.append("")
    return "\n".join(lines)


def build_report(inputs: list[str], out_dir: str | Path, title: str = "trainlab report") -> dict:
    """Write out_dir/index.html and out_dir/report.md (+ PNGs). Returns what went into it."""
    runs, results, notes = load_inputs(inputs)  # first: a bad input must not leave an empty report folder
    if not runs and not results:  # a report of nothing is not a success
        raise UserError(
            "nothing to report: no usable run or trainlab result among the inputs"
            + (f" ({'; '.join(notes)[:400]})" if notes else "")
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    blocks = [Block("h1", title)]
    blocks += [Block("note", n) for n in notes]
    if runs or results:
        blocks += summary_section(runs, results, out)
    if runs:
        logdirs = " ".join(sorted({str(r.path.parent) for r in runs}))
        blocks.append(para("Open the same runs in TensorBoard: ", code(f"tensorboard --logdir {logdirs}")))
    blocks += comparison_section(runs, out)
    for i, run in enumerate(runs):
        blocks += run_section(run, out, i)
    for i, res in enumerate(results):
        blocks += result_section(res, out, i)
    atomic_write_text(out / "index.html", to_html(blocks, title))
    atomic_write_text(out / "report.md", to_markdown(blocks))
    return {
        "runs": [str(r.path) for r in runs],
        "results": [str(r.path) for r in results],
        "notes": notes,
        "images": [b.src for b in blocks if b.kind == "img"],
        "index": str(out / "index.html"),
    }
