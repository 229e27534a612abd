"""Build the report: inputs → a list of blocks → index.html and report.md (same content, two renderings).

Every number on the page is read from an input file; nothing is recomputed or rounded away without
the raw value being shown too (the summary table prints the JSON value as stored).
"""

from __future__ import annotations

import html
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from trainlab.io import atomic_write_text
from trainlab.report import plots
from trainlab.report.inputs import ResultFile, TrainingRun, load_inputs


@dataclass
class Block:
    kind: str            # h1 | h2 | h3 | p | table | img | pre | note
    text: str = ""
    rows: list[list[str]] | None = None   # table: first row is the header
    src: str = ""        # img: path relative to the report directory


def _fmt(v, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e-3 or abs(v) >= 1e5 else f"{v:.{digits}f}".rstrip("0").rstrip(".")
    return str(v)


def _bytes(v) -> str:
    if v is None:
        return "–"
    return f"{v / 2**30:.2f} GiB" if v >= 2**30 else f"{v / 2**20:.1f} MiB"


# ------------------------------------------------------------------------------------ sections

def run_section(run: TrainingRun, out: Path, index: int) -> list[Block]:
    s, cfg, env = run.summary, run.config, run.env
    blocks = [Block("h2", f"Training run: {run.name}"), Block("p", f"Run directory: <code>{html.escape(str(run.path))}</code>")]
    keys = ["test_accuracy", "test_loss", "epochs", "train_seconds", "time_to_99_seconds", "images_per_s_median",
            "device", "device_name", "params", "act", "seed"]
    rows = [["summary key", "value (as in summary.json)"]] + [[k, json.dumps(s[k])] for k in keys if k in s]
    blocks.append(Block("table", rows=rows))
    if cfg:
        shown = {k: v for k, v in cfg.items() if v is not None and k not in ("progress", "tensorboard", "out", "name")}
        blocks.append(Block("h3", "Configuration"))
        blocks.append(Block("p", ", ".join(f"{k}={_fmt(v)}" for k, v in shown.items())))
    if env:
        blocks.append(Block("h3", "Environment"))
        gpus = ", ".join(env.get("gpus") or []) or "none"
        blocks.append(Block("p", f"python {env.get('python')}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), "
                                 f"CPU {env.get('cpu')} × {env.get('cpu_count')}, GPUs: {gpus}, {env.get('time_utc')}"))
        if env.get("nvidia_smi"):
            blocks.append(Block("pre", env["nvidia_smi"]))
    prefix = f"run{index}_"
    for title, fn in (("Loss", plots.loss_curves), ("Test accuracy", plots.accuracy_curve), ("GPU", plots.gpu_timeline)):
        png = fn(run, out / f"{prefix}{fn.__name__}.png")
        if png is not None:
            blocks.append(Block("img", title, src=png.name))
        elif title == "GPU":
            blocks.append(Block("note", "No GPU record (gpu.csv) in this run: it ran on the CPU or without NVML."))
        else:
            blocks.append(Block("note", f"No metrics.jsonl: {title.lower()} curve omitted."))
    if "per_class_accuracy" in s:
        blocks.append(Block("img", "Per-class accuracy", src=plots.per_class_bars(run, out / f"{prefix}per_class.png").name))
    if "confusion_matrix" in s:
        blocks.append(Block("img", "Confusion matrix", src=plots.confusion(run, out / f"{prefix}confusion.png").name))
    if run.epochs:
        rows = [["epoch", "train loss", "test loss", "test acc (%)", "images/s", "seconds"]]
        rows += [[str(r["epoch"]), _fmt(r["train_loss"]), _fmt(r["test_loss"]), _fmt(r["test_accuracy"]),
                  f"{r['images_per_s']:,.0f}", _fmt(r["epoch_seconds"], 3)] for r in run.epochs]
        blocks.append(Block("table", rows=rows))
    return blocks


def comparison_section(runs: list[TrainingRun], out: Path) -> list[Block]:
    """Runs grouped by what differs (activation, preset, parallel mode): mean ± sd over seeds."""
    if len(runs) < 2:
        return []
    groups: dict[str, list[TrainingRun]] = defaultdict(list)
    for r in runs:
        c = r.config
        label = " ".join(str(x) for x in (c.get("act", r.summary.get("act")), c.get("preset"), c.get("parallel"))
                         if x not in (None, "default", "none"))
        groups[label or "default"].append(r)
    rows = [["group", "runs (seeds)", "test acc mean (%)", "sd", "min", "max", "train s (median)"]]
    labels, means, sds = [], [], []
    for label, members in groups.items():
        accs = [m.summary["test_accuracy"] for m in members]
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        seeds = ",".join(str(m.summary.get("seed", "?")) for m in members)
        rows.append([label, f"{len(members)} ({seeds})", _fmt(statistics.mean(accs)), _fmt(sd), _fmt(min(accs)), _fmt(max(accs)),
                     _fmt(statistics.median(m.summary.get("train_seconds", 0.0) for m in members), 3)])
        labels.append(label)
        means.append(statistics.mean(accs))
        sds.append(sd)
    blocks = [Block("h2", "Comparison across runs"), Block("table", rows=rows)]
    png = plots.bars(labels, means, out / "compare_accuracy.png", "Test accuracy by group (mean ± sd)", "test accuracy (%)", sds)
    blocks.append(Block("img", "Accuracy by group", src=png.name))
    return blocks


def table_from_rows(rows: list[dict], preferred: list[str]) -> list[list[str]]:
    """The preferred columns that the rows have, in that order, one table row per input row."""
    keys = [k for k in preferred if any(k in r for r in rows)]
    return [keys] + [[_bytes(r.get(k)) if k.endswith("bytes") and isinstance(r.get(k), (int, float)) else _fmt(r.get(k)) for k in keys] for r in rows]


def result_section(res: ResultFile, out: Path, index: int) -> list[Block]:
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
    }[res.kind]
    blocks = [Block("h2", title), Block("p", f"Source: <code>{html.escape(str(res.path))}</code>")]
    if res.kind == "gelu_check":
        failed = [r for r in rows if r.get("ok") is False]
        blocks.append(Block("p", f"{len(rows)} rows, {len(failed)} failing."))
        blocks.append(Block("table", rows=table_from_rows(rows, ["impl", "approximate", "dtype", "fwd_max_abs_err", "grad_max_abs_err", "gradcheck", "ok"])))
    elif res.kind == "gelu_bench":
        blocks.append(Block("table", rows=table_from_rows(rows, ["size", "impl", "pass", "dtype", "approximate", "median_s", "p10_s", "p90_s",
                                                                 "gbps", "ratio_to_torch", "pct_of_copy_bw"])))
    elif res.kind == "dp_compare":
        blocks.append(Block("table", rows=table_from_rows(rows, ["mode", "world_size", "loader", "workers", "epoch_seconds", "images_per_s",
                                                                 "data_ms_per_step", "compute_ms_per_step", "comm_ms_per_step", "test_accuracy"])))
        labels = [f"{r.get('mode')}×{r.get('world_size')}" + (f" w{r['workers']}" if r.get("workers") is not None else "") for r in rows]
        png = plots.bars(labels, [float(r.get("images_per_s") or 0) for r in rows], out / f"result{index}_dp.png", "Throughput by mode", "images/s")
        blocks.append(Block("img", "Throughput by mode", src=png.name))
    elif res.kind == "gpt_bench":
        d = res.data
        blocks.append(Block("table", rows=[["metric", "value"]] + [[k, _bytes(d[k]) if k.endswith("bytes") else _fmt(d[k])] for k in
                                             ("strategy", "world_size", "params", "step_seconds_median", "tokens_per_s", "tflops_per_device",
                                              "mfu", "peak_memory_bytes") if k in d]))
        if d.get("losses"):
            blocks.append(Block("p", "losses: " + ", ".join(_fmt(x) for x in d["losses"])))
    elif res.kind == "gpt_plan":
        d = res.data
        blocks.append(Block("p", f"model params: {d.get('params'):,}"))
        blocks.append(Block("table", rows=table_from_rows(rows, ["strategy", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
                                                                 "total_bytes", "fits", "max_micro_batch"])))
    elif res.kind == "lenet_profile":   # ms per training step, medians; rows = variant x part
        blocks.append(Block("p", f"{res.data.get('steps')} profiled steps per variant (interleaved), batch "
                                 f"{res.data.get('batch_size')}, device {res.data.get('device')}; trace: {res.data.get('trace')}"))
        blocks.append(Block("table", rows=table_from_rows(rows, ["variant", "layer", "fwd_ms_median", "bwd_ms_median", "total_ms_median",
                                                                 "fwd_ms_p10", "fwd_ms_p90", "bwd_ms_p10", "bwd_ms_p90"])))
    elif res.kind == "ops_check":
        failed = [r for r in rows if r.get("ok") is False]
        blocks.append(Block("p", f"{len(rows)} rows, {len(failed)} failing."))
        blocks.append(Block("table", rows=table_from_rows(rows, ["op", "case", "impl", "dtype", "fwd_max_abs_err", "grad_max_abs_err",
                                                                 "worst_ratio_to_tol", "ok"])))
    elif res.kind == "ops_bench":
        blocks.append(Block("table", rows=table_from_rows(rows, ["batch", "layer", "impl", "fwd_median_s", "fwd_ratio_to_aten",
                                                                 "bwd_median_s", "bwd_ratio_to_aten"])))
    elif res.kind == "gpt_compare":
        blocks.append(Block("table", rows=table_from_rows(rows, ["strategy", "nproc", "status", "step_ms_median", "tokens_per_s",
                                                                 "tflops_per_device", "mfu", "peak_tensor_bytes", "predicted_bytes",
                                                                 "first_loss_diff_vs_none"])))
        ok = [r for r in rows if r.get("tokens_per_s")]
        if ok:
            png = plots.bars([r["strategy"] for r in ok], [r["tokens_per_s"] for r in ok], out / f"result{index}_gpt_tps.png", "GPT throughput per strategy", "tokens/s")
            blocks.append(Block("img", "Throughput per strategy", src=png.name))
            key = "peak_tensor_bytes" if any(r.get("peak_tensor_bytes") for r in ok) else "peak_memory_bytes"
            mem = [r for r in ok if r.get(key)]
            if mem:
                png = plots.bars([r["strategy"] for r in mem], [r[key] / 2**20 for r in mem], out / f"result{index}_gpt_mem.png",
                                 f"Peak memory per strategy ({key.replace('_', ' ')})", "MiB")
                blocks.append(Block("img", "Peak memory per strategy", src=png.name))
    return blocks


# ------------------------------------------------------------------------------------ rendering

CSS = """body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;margin:.5em 0}
.note{color:#8a6d3b;background:#fcf8e3;padding:.3em .6em}pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:.8em}
figure{margin:0}figcaption{font-size:.85em;color:#555}"""


def to_html(blocks: list[Block], title: str) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style></head><body>"]
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            parts.append(f"<{b.kind}>{html.escape(b.text)}</{b.kind}>")
        elif b.kind == "p":
            parts.append(f"<p>{b.text}</p>")  # trusted: built above with escaped inputs
        elif b.kind == "note":
            parts.append(f"<p class='note'>{html.escape(b.text)}</p>")
        elif b.kind == "pre":
            parts.append(f"<pre>{html.escape(b.text)}</pre>")
        elif b.kind == "img":
            parts.append(f"<figure><img src='{html.escape(b.src)}' alt='{html.escape(b.text)}'><figcaption>{html.escape(b.text)}</figcaption></figure>")
        elif b.kind == "table":
            head, *body = b.rows
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body]
            parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def to_markdown(blocks: list[Block]) -> str:
    import re

    lines = []
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            lines += ["#" * int(b.kind[1]) + " " + b.text, ""]
        elif b.kind in ("p", "note"):
            lines += [re.sub(r"</?code>", "`", b.text) if b.kind == "p" else f"> {b.text}", ""]
        elif b.kind == "pre":
            lines += ["```", b.text.rstrip(), "```", ""]
        elif b.kind == "img":
            lines += [f"![{b.text}]({b.src})", ""]
        elif b.kind == "table":
            head, *body = b.rows
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in body]
            lines.append("")
    return "\n".join(lines)


def build_report(inputs: list[str], out_dir: str | Path, title: str = "trainlab report") -> dict:
    """Write out_dir/index.html and out_dir/report.md (+ PNGs). Returns what went into it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs, results, notes = load_inputs(inputs)
    blocks = [Block("h1", title)]
    blocks += [Block("note", n) for n in notes]
    if runs:
        logdirs = " ".join(sorted({str(r.path.parent) for r in runs}))
        blocks.append(Block("p", f"Open the same runs in TensorBoard: <code>tensorboard --logdir {html.escape(logdirs)}</code>"))
    for i, run in enumerate(runs):
        blocks += run_section(run, out, i)
    blocks += comparison_section(runs, out)
    for i, res in enumerate(results):
        blocks += result_section(res, out, i)
    if not runs and not results:
        blocks.append(Block("note", "No usable inputs: give run directories or trainlab result JSON files."))
    atomic_write_text(out / "index.html", to_html(blocks, title))
    atomic_write_text(out / "report.md", to_markdown(blocks))
    return {"runs": [str(r.path) for r in runs], "results": [str(r.path) for r in results], "notes": notes,
            "images": [b.src for b in blocks if b.kind == "img"], "index": str(out / "index.html")}
