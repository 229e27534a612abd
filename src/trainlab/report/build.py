"""Build the report: inputs → a list of blocks → index.html and report.md (same content, two renderings).

The page opens with a one-screen summary (accuracy, time, time-to-99 %, throughput, device, GPU
utilization and its figure when a run has one), then the comparison of groups of runs (a sweep: mean ±
sd over seeds, one plot per swept flag), then each run and each result file. Numbers are formatted for
people (`report.format`: 99.33 %, 25.5 s, 12,822 img/s); every number is read from an input file, and
each run's section keeps its summary.json values unrounded in a "raw values" block.

Sections are functions returning blocks, so a new input kind adds a section without touching the others.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from trainlab import __version__
from trainlab.errors import UserError
from trainlab.io import atomic_write_text
from trainlab.report import format as fmt
from trainlab.report import markdown as md
from trainlab.report import plots
from trainlab.report.blocks import Block, code, link, para
from trainlab.report.groups import group_runs, series_for
from trainlab.report.inputs import ResultFile, TrainingRun, load_inputs
from trainlab.report.sections import result_section
from trainlab.report.sections.common import Ctx
from trainlab.report.sections.lenet import device, gpu_util, run_section, time_to_99
from trainlab.results.kinds import KINDS

# Above this many runs the summary shows groups (mean ± sd) instead of one row per run.
SUMMARY_MAX_RUN_ROWS = 12


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
                    time_to_99(r.summary),
                    fmt.rate(r.summary.get("images_per_s_median")),
                    device(r),
                    gpu_util(r),
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
            pieces += [", " if i else "", code(r.path.name), f" ({KINDS[r.kind].title})"]
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


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


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
.student{border:2px dashed #4a7;padding:.2em .6em;margin:.4em 0}.student .mark{color:#275;font-weight:bold;margin:0}
.student .ask{margin:.1em 0;font-size:.9em}.student .answer{min-height:1.2em}
@media print{details.fold{border:0;padding:0}}"""


# what report.md holds in a student's place: the line to replace with their own text
STUDENT_MARK = "<!-- the student's own text goes here; trainlab never writes it -->"


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
        elif b.kind == "student":  # a marked place of the student's: never filled by trainlab
            lines += [f"> ✎ **{md.text(b.text)}**", *([f"> {md.text(b.body)}"] if b.body else []), "", STUDENT_MARK, ""]
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


def generated_by() -> Block:
    """The page's provenance, on its first screen: trainlab made it; the reader owns what is marked theirs."""
    return para(f"Generated by trainlab {__version__} from the files named in each section.")


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
    blocks = [Block("h1", title), generated_by()]
    blocks += [Block("note", n) for n in notes]
    if runs or results:
        blocks += summary_section(runs, results, out)
    if runs:
        logdirs = " ".join(sorted({str(r.path.parent) for r in runs}))
        blocks.append(para("Open the same runs in TensorBoard: ", code(f"tensorboard --logdir {logdirs}")))
    blocks += comparison_section(runs, out)
    for i, run in enumerate(runs):
        blocks += run_section(run, Ctx(out, i))
    for i, res in enumerate(results):
        blocks += result_section(res, Ctx(out, i))
    atomic_write_text(out / "index.html", to_html(blocks, title))
    atomic_write_text(out / "report.md", to_markdown(blocks))
    return {
        "runs": [str(r.path) for r in runs],
        "results": [str(r.path) for r in results],
        "notes": notes,
        "images": [b.src for b in blocks if b.kind == "img"],
        "index": str(out / "index.html"),
    }
