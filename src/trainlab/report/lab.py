"""The lab's report, a hand-in organised as the handout's §6 (DIR/report/index.html and report.md).

One section per deliverable of §6, in its order, each with a few lines of procedure:
1. LeNet-5 on MNIST on the GPU — the architecture table (from the model the run built) and the test
   accuracy against the 98 % bar;
2. the GELU operator — its formula and derivative, the implementations, how their correctness was
   checked (the handout's recipe and more) and LeNet-5 trained with it;
3. what is handed in — 3.1 the code; 3.2 the report: the procedure (the calls and steps), nvidia-smi
   taken *during* training beside NVML's mean and peak, the loss and accuracy curves with the exact
   `tensorboard --logdir` command for the lab's event files, the test accuracies, and the GPT-2 bonus:
   the speed-up broken down (`report.ablation`: the ablation file's schema is documented there; the
   lab's own GPT benchmarks when the lab folder has none);
4. no pretrained networks;
5. code trainlab draws on and where F.gelu lives in PyTorch's source;
then what the lab does beyond the handout (trainlab's own operators, data parallel), the student's
marked places (procedure, discussion, the handout's 思考 questions: never generated) and the references.

Every step's whole output — the tables and figures `trainlab report` makes of it — folds away under
its title (<details>), so the page stays short (≤ 8 screens of 1200×800 px for the H100 lab); a
step that did not finish says why in one line (a failed step: the last error line of its log).
`build_lab_report(root, state, out)` rebuilds the page from the lab folder alone, on any machine
(`trainlab report LABDIR -o OUT`); nothing is rerun. The folder is read by `report.lab_folder`; the
fixed text (sections, formulas, PyTorch's source locations, references) is `report.lab_text`.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from trainlab import __version__
from trainlab.io import atomic_write_text
from trainlab.report import format as fmt
from trainlab.report import plots
from trainlab.report.ablation import ablation_blocks, bench_rows, overall_speedup
from trainlab.report.blocks import Block, code, fold, link, para, student
from trainlab.report.build import to_html, to_markdown
from trainlab.report.inputs import ResultFile
from trainlab.report.lab_folder import Lab, inside, load_student, log_tail, status_line
from trainlab.report.lab_text import (
    GELU_FORMULAS,
    GELU_SOURCE,
    HEADING,
    REFERENCES,
    STANDARD_LENET5,
    STRATEGY_WORDS,
)
from trainlab.report.sections import result_section
from trainlab.report.sections.common import Ctx, dataset_words, model_words
from trainlab.report.sections.lenet import busy_snapshot, run_section
from trainlab.report.sections.ops import GELU_RECIPE_NOTE
from trainlab.report.sections.ops import bench_rows as gelu_bench_rows
from trainlab.report.sections.table import scalar_table

HANDOUT_PASS_BAR = (
    98.0  # the handout's pass bar for LeNet-5 test accuracy (§4.1.5; not the 99 % time-to-accuracy target, lenet.loop)
)


def _demote(blocks: list[Block], by: int = 1) -> list[Block]:
    """Sections of `trainlab report` some levels down, inside a step's fold."""
    for b in blocks:
        if b.kind in ("h2", "h3", "h4"):
            b.kind = f"h{min(5, int(b.kind[1]) + by)}"
    return blocks


# ------------------------------------------------------------------------------------ pieces


def _step_detail(lab: Lab, step: dict) -> list[Block]:
    """A step's whole output folded under its title, or the one line that says why there is none."""
    name, rec = step["name"], lab.recs.get(step["name"])
    title = (rec or {}).get("title") or step.get("title") or name
    line = status_line(name, rec, lab.root)
    if line:
        return [para(f"{title}: "), Block("status", line)]
    if not inside(lab.root, lab.root / "steps" / name):
        where = lab.root / "steps" / name
        why = (
            f"steps/{name} is a link out of the lab folder"
            if where.is_symlink()
            else f"{name}: not inside the lab folder's steps/"
        )
        return [para(f"{title}: "), Block("status", f"{why}; not read")]
    index = lab.index(name)
    body = [
        para(
            f"Measured in {fmt.seconds(rec.get('seconds'))} (estimate {fmt.seconds(rec.get('estimate_s'))}); "
            "command, run in the lab folder: ",
            code(lab.command(rec.get("command", ""))),
        )
    ]
    runs, known, other = lab.outputs(name)
    for i, run in enumerate(runs):
        ctx = Ctx(lab.out, index * 10 + i, reuse=True, root=lab.root)
        body += _demote(run_section(run, ctx, curves=name != "lenet_train"), by=3)
    for i, res in enumerate(known):
        body += _demote(result_section(res, Ctx(lab.out, index * 10 + i, reuse=True, root=lab.root)), by=3)
    for path, data in other:
        rows = [r for r in (data["rows"] if isinstance(data, dict) else data) if isinstance(r, dict)]
        if rows:
            body.append(para("From ", code(path.relative_to(lab.root)), ":"))
            body.append(Block("table", rows=scalar_table(rows)))
    if not (runs or known or other):
        body.append(Block("pre", "\n".join(log_tail(lab.root / "steps" / name / "log.txt", lab.root)[-15:])))
    return [fold(f"{title} — {name}, {fmt.seconds(rec.get('seconds'))}: everything it measured", body)]


def _details(lab: Lab, part: str, skip: tuple = ()) -> list[Block]:
    blocks: list[Block] = []
    for step in lab.steps(part):
        if step["name"] not in skip:
            blocks += _step_detail(lab, step)
    return blocks


def _accuracy_line(s: dict) -> str:
    acc = s.get("test_accuracy")
    met = "met" if fmt.is_number(acc) and acc >= HANDOUT_PASS_BAR else "missed"
    return (
        f"test accuracy {fmt.pct(acc)} after {fmt.count(s.get('epochs'))} epochs ({fmt.seconds(s.get('train_seconds'))} "
        f"of training) — the handout's {HANDOUT_PASS_BAR:.0f} % bar: {met}"
    )


def lenet_architecture(summary: dict, config: dict) -> tuple[list[list[str]], str] | None:
    """Layer, output shape and parameters of the LeNet-5 a run built, and where the table comes from.

    The report reads files, not workloads: a run records its own table (summary.json `architecture`,
    written by lenet.architecture). A run from before that field gets the handout's standard LeNet-5
    from fixed text, and only when its config is that standard one (tests hold the text to the model)."""
    rows = summary.get("architecture")
    if isinstance(rows, list) and rows and all(isinstance(r, list) and len(r) == 3 for r in rows):
        return [[str(c) for c in r] for r in rows], "recorded by the run"
    standard = (
        config.get("model", "lenet5") == "lenet5"
        and config.get("pool", "max") == "max"
        and not config.get("batchnorm")
        and config.get("act", "relu") == "relu"
    )
    return (
        ([list(r) for r in STANDARD_LENET5], "the standard LeNet-5 (this run predates recorded tables)")
        if standard
        else None
    )


# ------------------------------------------------------------------------------------ sections


def _front(lab: Lab) -> list[Block]:
    hw, state = lab.state.get("hardware") or {}, lab.state
    data = state.get("data") or {}  # the lab's --mnist, where it is not the official MNIST (run.py)
    ran = [r for r in lab.recs.values() if r.get("status") == "ok"]
    who = lab.student
    blocks = [
        Block(
            "h1", f"Lab 5: LeNet-5, a GELU operator and GPT-2 — trainlab lab on {hw.get('name', 'an unknown device')}"
        ),
        para(
            f"Student: {who.get('name') or '(name: --name, or student.json in the lab folder)'}; student ID: "
            f"{who.get('student_id') or '(--student-id, or student.json)'}."
        ),
        para(
            f"Generated by trainlab {__version__} from this lab folder's records: the measurements, tables and "
            "figures are trainlab's; the places marked ✎ are the student's own, and trainlab never fills them."
        ),
        para(
            f"Hardware: {hw.get('name')} ({hw.get('kind')}, {hw.get('gpus')} GPU(s), {hw.get('cpus')} CPU cores); size "
            f"{state.get('size')}; {len(ran)} of {len(lab.plan)} steps ok over {len(state.get('calls', []))} call(s). "
            "Sections follow the handout's §6; every step's full output is folded under its title."
        ),
        *([Block("note", f"Data: --mnist {data.get('line')}")] if data and not data.get("official", True) else []),
        Block(
            "toc",
            links=[
                (HEADING[a], a)
                for a in (
                    "lenet",
                    "gelu",
                    "handin",
                    "gpu",
                    "tensorboard",
                    "gpt",
                    "pretrained",
                    "sources",
                    "extra",
                    "yours",
                    "references",
                )
            ],
        ),
        Block("table", rows=_at_a_glance(lab), text_table=True),
    ]
    return blocks


def _at_a_glance(lab: Lab) -> list[list[str]]:
    rows = [["handout §6", "result", "steps ok"]]

    def steps_ok(part):
        names = [s["name"] for s in lab.steps(part)]
        bad = [f"{n} ({(lab.recs.get(n) or {}).get('status', 'not reached')})" for n in names if not lab.ok(n)]
        return f"{len(names) - len(bad)} of {len(names)}" + (f"; {', '.join(bad)}" if bad else "")

    lenet = lab.runs("lenet_train")
    rows.append([HEADING["lenet"], _accuracy_line(lenet[0].summary) if lenet else "not measured", steps_ok("lenet")])
    check = lab.result("gelu_check", "gelu_check")
    gelu_runs = lab.runs("gelu_train")
    gelu = []
    if check:
        ok = [r for r in check.rows if r.get("ok") is True and not r.get("skipped")]
        gelu.append(f"{len(ok)} of {len(check.rows)} checks ok")
    if gelu_runs:
        gelu.append(
            f"LeNet-5 with {gelu_runs[0].summary.get('act')}: {fmt.pct(gelu_runs[0].summary.get('test_accuracy'))}"
        )
    rows.append([HEADING["gelu"], "; ".join(gelu) or "not measured", steps_ok("gelu")])
    g = (lenet[0].summary.get("gpu") or {}) if lenet else {}
    rows.append(
        [
            "3.2.2 GPU utilization (nvidia-smi, NVML)",
            f"NVML mean {fmt.pct(g.get('utilization_mean_pct'), 0)}, peak "
            f"{fmt.pct(g.get('utilization_max_pct'), 0)} while LeNet-5 trains"
            if g
            else "not measured (no GPU record)",
            "",
        ]
    )
    rows.append([HEADING["gpt"], gpt_speedup_line(lab), steps_ok("gpt")])
    rows.append([HEADING["extra"], "", f"ops {steps_ok('ops')}; dp {steps_ok('dp')}"])
    return rows


def _ablation(lab: Lab) -> ResultFile | None:
    return next((r for s in lab.steps("gpt") for r in lab.outputs(s["name"])[1] if r.kind == "gpt_ablation"), None)


def gpt_speedup_line(lab: Lab) -> str:
    """The one speed-up the page states: the ablation's (the same number as its table's speed-up column)
    when the folder has one, else the fastest benchmark's over the baseline's — never both."""
    ablation = _ablation(lab)
    if ablation is not None:
        found = overall_speedup(ablation.data)
        return (
            f"{found[1]:.2f}× the handout's baseline in tokens/s ({found[0]}; the ablation)"
            if found
            else "not measured"
        )
    base, best = lab.bench("gpt_baseline"), lab.bench("gpt_best")
    if base and best and fmt.is_number(base.get("tokens_per_s")) and fmt.is_number(best.get("tokens_per_s")):
        if base["tokens_per_s"] > 0:
            return (
                f"{best['tokens_per_s'] / base['tokens_per_s']:.2f}× the handout's baseline in tokens/s "
                f"({best.get('strategy')})"
            )
    return "not measured"


def _trained_on(run) -> str:
    """What the run trained and tested on, from its plan; an old run states only what its files hold."""
    plan = run.plan or {}
    words = dataset_words(plan.get("dataset"))
    if words:
        return f"on {words}"
    c = run.config
    sizes = [f"{fmt.count(c[k])} {w}" for k, w in (("train_subset", "training"), ("test_subset", "test")) if c.get(k)]
    return f"on {c.get('dataset', 'mnist')}" + (f" ({' and '.join(sizes)} images)" if sizes else "")


def _lenet(lab: Lab) -> list[Block]:
    blocks = [Block("h2", HEADING["lenet"], anchor="lenet")]
    runs = lab.runs("lenet_train")
    if not runs:
        blocks.append(
            Block(
                "status",
                status_line("lenet_train", lab.recs.get("lenet_train"), lab.root) or "lenet_train: no run found",
            )
        )
        return blocks + _details(lab, "lenet")
    run = runs[0]
    c, s = run.config, run.summary
    blocks.append(
        para(
            "LeNet-5 is a torch.nn.Module (",
            code("src/trainlab/lenet/model.py"),
            ") trained by ",
            code("trainlab train"),
            f" {_trained_on(run)}, tested after every epoch (under torch.no_grad()): "
            f"{c.get('optimizer', '?')} at learning rate {fmt.number(c.get('lr'))} with a {c.get('schedule', '?')} schedule, batch "
            f"{fmt.count(c.get('batch_size'))}, {fmt.count(c.get('epochs'))} epochs, cross-entropy loss, on "
            f"{s.get('device_name') or s.get('device')}"
            + (f" in {s.get('amp')} autocast" if s.get("amp") not in (None, "off", "no") else "")
            + ". The dataset is read by trainlab's own code (",
            code("src/trainlab/data/mnist.py"),
            ": IDX parsing and a "
            "torch.utils.data.Dataset subclass), not torchvision; "
            + (
                "the whole set stays on the device and batches are sliced there (--loader device)."
                if c.get("loader", "device") == "device"
                else "a DataLoader feeds the batches (--loader dataloader)."
            ),
        )
    )
    arch = lenet_architecture(s, c)
    if arch:
        blocks.append(Block("table", rows=arch[0]))
        if c.get("act", "relu") == "relu" and c.get("pool", "max") == "max":
            blocks.append(
                para(
                    f"LeNet-5 {lab.cite('lenet')} in its common modern form (ReLU, max-pooling). ReLU comes after "
                    "the pooling: max(relu(x)) = relu(max(x)), gradient included, on a quarter of the values."
                )
            )
        elif c.get("act", "relu") == "relu":
            blocks.append(
                para(
                    f"LeNet-5 {lab.cite('lenet')} with ReLU and average pooling (the original's subsampling, "
                    "without its trainable scale): ReLU comes before the pooling, which averages the rectified values."
                )
            )
    blocks.append(
        para(
            _accuracy_line(s)[0].upper() + _accuracy_line(s)[1:] + ". Curves: ",
            _link("tensorboard"),
            "; GPU utilization: ",
            _link("gpu"),
            ".",
        )
    )
    return blocks + _details(lab, "lenet")


def _link(anchor: str) -> tuple:

    return link("§" + HEADING[anchor].split(" ")[0].rstrip("."), anchor)


def _gelu_summary(check: ResultFile) -> list[list[str]]:
    """One row per implementation: the worst errors over its dtypes, the handout's recipe, gradcheck."""
    impls: dict[str, list[dict]] = {}
    for r in check.rows:
        impls.setdefault(str(r.get("impl")), []).append(r)

    def worst(rows, key, dtypes=("float32", "float64")):
        xs = [r[key] for r in rows if fmt.is_number(r.get(key)) and r.get("dtype") in dtypes]
        return max(xs) if xs else None

    table = [
        [
            "implementation",
            "rows ok",
            "forward max |error| (fp32)",
            "gradient max |error| (fp32)",
            "|Δloss| (worst)",
            "gradient MSE (worst)",
            "gradcheck, gradgradcheck (fp64)",
        ]
    ]
    for impl, rows in impls.items():
        ok = sum(1 for r in rows if r.get("ok") is True and not r.get("skipped"))
        skipped = sum(1 for r in rows if r.get("skipped"))
        checks = [r.get(k) for r in rows for k in ("gradcheck", "gradgradcheck") if r.get(k) is not None]
        table.append(
            [
                impl,
                f"{ok} of {len(rows)}" + (f" ({skipped} skipped)" if skipped else ""),
                fmt.number(worst(rows, "fwd_max_abs_err", ("float32",))),
                fmt.number(worst(rows, "grad_max_abs_err", ("float32",))),
                fmt.number(worst(rows, "recipe_loss_diff", ("float32", "float64", "bfloat16"))),
                fmt.number(worst(rows, "recipe_grad_mse", ("float32", "float64", "bfloat16"))),
                ("pass" if all(checks) else "FAIL") if checks else fmt.MISSING,
            ]
        )
    return table


def _gelu_speed_line(bench: ResultFile) -> str | None:
    """The largest size's forward + backward ratios; a ratio flagged as implausible is named, not quoted."""
    flagged, _ = gelu_bench_rows(bench)
    rows = [r for r in flagged if fmt.is_number(r.get("size")) and r.get("pass") == "fwd+bwd"]
    if not rows:
        return None
    n = max(r["size"] for r in rows)
    at = [r for r in rows if r["size"] == n]
    parts = [
        f"{r.get('impl')}: flagged (an implausible timing; see the step's fold)"
        if r.get("ratio_to_torch") == "flagged"
        else f"{r.get('impl')} {fmt.number(r.get('ratio_to_torch'))}× F.gelu's time "
        f"({fmt.value('pct_of_copy_bw', r.get('pct_of_copy_bw'))} of copy bandwidth)"
        for r in at
        if r.get("impl") != "aten"
    ]
    return f"Speed, forward + backward on {fmt.count(n)} {at[0].get('dtype', '')} elements: " + "; ".join(parts) + "."


def _gelu(lab: Lab) -> list[Block]:
    blocks = [
        Block("h2", HEADING["gelu"], anchor="gelu"),
        para(
            f"GELU {lab.cite('gelu')} weighs its input by the probability that a standard normal variable is below it:"
        ),
        Block("pre", GELU_FORMULAS),
        para(
            "trainlab's operator (",
            code("src/trainlab/ops/gelu/"),
            ") has one forward and one backward per implementation: ",
            code("python"),
            ", a torch.autograd.Function whose backward is the derivative above; ",
            code("cpp"),
            ", a C++ extension (",
            code("ops/gelu/gelu_cpu.cpp"),
            ") built with torch.utils.cpp_extension and registered as a torch.library op with its autograd formula; ",
            code("cuda"),
            ", trainlab's CUDA kernel (",
            code("ops/gelu/gelu_cuda_kernels.cu"),
            "); ",
            code("triton"),
            ", a Triton kernel (",
            code("ops/gelu/gelu_triton.py"),
            "). ",
            code("aten"),
            " is F.gelu itself, checked the same way as a control.",
        ),
    ]
    check = lab.result("gelu_check", "gelu_check")
    if check:
        blocks.append(
            para(
                "Correctness (",
                code("trainlab gelu check"),
                "): every implementation against F.gelu evaluated in "
                "float64 on the same inputs — 4,096 random values and the edge values ±0, ±10, ±10⁴, ±inf, NaN and "
                "denormals — forward and gradient, in float32, float64 and bfloat16; gradcheck and gradgradcheck "
                "in float64; and the handout's recipe. " + GELU_RECIPE_NOTE,
            )
        )
        blocks.append(Block("table", rows=_gelu_summary(check)))
    runs = lab.runs("gelu_train")
    relu = lab.runs("lenet_train")
    if runs:
        s = runs[0].summary
        blocks.append(
            para(
                f"In LeNet-5 (every activation {s.get('act')}): {_accuracy_line(s)}"
                + (f"; with ReLU (§1) {fmt.pct(relu[0].summary.get('test_accuracy'))}" if relu else "")
                + "."
            )
        )
    bench = lab.result("gelu_bench", "gelu_bench")
    line = _gelu_speed_line(bench) if bench else None
    if line:
        blocks.append(para(line))
    return blocks + _details(lab, "gelu")


def _handin(lab: Lab) -> list[Block]:
    blocks = [
        Block("h2", HEADING["handin"], anchor="handin"),
        Block("h3", "3.1 The code"),
        para(
            "The code that ran is trainlab's (",
            code("src/trainlab/"),
            ", credited in the references), not the student's: LeNet-5 in ",
            code("lenet/model.py"),
            ", its training step in ",
            code("lenet/step.py"),
            " and loop in ",
            code("lenet/loop.py"),
            "; GELU in ",
            code("ops/gelu/"),
            " (one folder per operator, listed in ",
            code("ops/registry.py"),
            "); GPT-2 and its strategies in ",
            code("gpt/"),
            "; this lab in ",
            code("lab/"),
            ". Each step below is one command a student can type; its exact line is in the step's fold.",
        ),
        para(
            "What the handout (§4, §6) asks the student to write: LeNet-5 as a torch.nn.Module with its forward "
            "(§4.1.2), the training and test loops (§4.1.3–4.1.4), GELU as a torch.autograd.Function with forward "
            "and backward and its check against F.gelu (§4.2.1), the same operator in C++ through "
            "torch.utils.cpp_extension used in LeNet-5 (§4.2.2), and, for the bonus, GPT-2 training with "
            "acceleration strategies (§5). The handout's similarity check (§6.5) applies to the student's code: "
            "code taken from trainlab or elsewhere is listed, with what the student understood of it.",
        ),
        student("The student's code", "Where it is, what it implements, and what was taken from where."),
        Block("h3", "3.2 The report"),
    ]
    return blocks + _procedure(lab) + _gpu(lab) + _tensorboard(lab) + _accuracy(lab) + _gpt(lab)


def _procedure(lab: Lab) -> list[Block]:
    calls = lab.state.get("calls", [])
    blocks = [
        Block("h4", HEADING["procedure"], anchor="procedure"),
        para(
            "The whole lab is one command, ",
            code("trainlab lab --out DIR"),
            ", run here in "
            f"{len(calls)} call(s) that resume one another in one folder. It runs each step as its own process under a "
            "time limit, records its status and time in results.json, and rebuilds this page after every step: "
            "LeNet-5 trained with telemetry; GELU checked, timed and trained; GPT-2's memory planned, trainlab's fastest "
            "configuration and the handout's baseline timed, strategies compared; then trainlab's own layer operators and "
            "data parallel, beyond the handout.",
        ),
    ]
    for c in calls:
        blocks.append(
            para(
                f"{c.get('started_utc')}, budget {fmt.seconds(c.get('budget_s'))}, used {fmt.seconds(c.get('used_s'))}: ",
                code(lab.command(c.get("command", ""))),
            )
        )
    table = [["step", "part", "status", "estimate", "measured", "measured / estimate", "limit", "sizes"]]
    for s in lab.plan:
        r = lab.recs.get(s["name"]) or {}
        sec, est = r.get("seconds"), r.get("estimate_s", s.get("estimate_s"))  # the estimate the step ran under
        ratio = f"{sec / est:.2f}" if fmt.is_number(sec) and fmt.is_number(est) and est else fmt.MISSING
        table.append(
            [
                s["name"],
                str(s.get("part")),
                r.get("status", "not reached") + (f": {r['reason']}" if r.get("reason") else ""),
                fmt.seconds(est),
                fmt.seconds(sec),
                ratio,
                fmt.seconds(r.get("limit_s", s.get("limit_s"))),
                ", ".join(f"{k} {v}" for k, v in (s.get("sizes") or {}).items()),
            ]
        )
    blocks.append(fold("Steps: status, estimate against measured time", [Block("table", rows=table)]))
    return blocks


def _seconds_between(start: str | None, end: str | None) -> float | None:
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except (TypeError, ValueError):
        return None


def _gpu(lab: Lab) -> list[Block]:
    blocks = [Block("h4", HEADING["gpu"], anchor="gpu")]
    runs = lab.runs("lenet_train")
    if not runs:
        return blocks + [Block("status", "No LeNet-5 run: nothing to show.")]
    run = runs[0]
    g = run.summary.get("gpu") or {}
    busy = busy_snapshot(run.env)
    row: list[Block] = []
    if busy:
        after = _seconds_between(run.env.get("time_utc"), busy["taken_utc"])
        row.append(Block("pre", busy["text"].rstrip()))
        what = f"nvidia-smi taken during training, {busy['taken_utc']}" + (
            f" ({after:.0f} s after the run started)" if after is not None else ""
        )
    elif run.env.get("nvidia_smi"):
        row.append(Block("pre", run.env["nvidia_smi"].rstrip()))
        what = "nvidia-smi taken at start-up, before training (this run has no snapshot taken during training)"
    else:
        what = "no nvidia-smi output (no NVIDIA driver: a CPU run)"
    png = lab.figure("lenet_gpu", run, plots.gpu_timeline) if run.gpu else None
    if png is not None:
        row.append(Block("img", "NVML, ~10 Hz, the whole run: utilization and memory", src=png.name))
    if row:
        blocks.append(Block("row", children=row))
    if g:
        blocks.append(
            para(
                f"{what}. NVML over the whole run ({fmt.count(g.get('samples'))} samples): utilization mean "
                f"{fmt.pct(g.get('utilization_mean_pct'), 0)}, peak {fmt.pct(g.get('utilization_max_pct'), 0)}; "
                f"memory peak {fmt.nbytes((g.get('memory_used_max_mib') or 0) * 2**20) if fmt.is_number(g.get('memory_used_max_mib')) else fmt.MISSING}. "
                "Both measure the share of time a kernel ran (nvidia-smi over its last sample period, up to 1 s): "
                "LeNet-5's kernels are tiny, so the GPU waits on the launches between them."
            )
        )
    else:
        blocks.append(para(f"{what}. NVML: no record."))
    return blocks


def _tensorboard(lab: Lab) -> list[Block]:
    blocks = [Block("h4", HEADING["tensorboard"], anchor="tensorboard")]
    steps = lab.root / "steps"
    ok = steps.is_dir() and inside(lab.root, steps)
    events = sorted(p for p in steps.rglob("events.out.tfevents.*") if inside(lab.root, p)) if ok else []
    if events:
        runs = sorted({str(p.parent.relative_to(steps)) for p in events})
        blocks.append(
            para(
                f"Every training run wrote TensorBoard event files ({len(events)} in {', '.join(runs)}): loss per "
                "step and per epoch, accuracy, learning rate, GPU utilization, the model graph, and misclassified "
                "digits. Open them all with ",
                code("tensorboard --logdir steps"),
                " in the lab folder and a browser at http://localhost:6006. The figures below are drawn from "
                "the same values (metrics.jsonl).",
            )
        )
    elif lab.runs("lenet_train"):
        blocks.append(
            para(
                "This folder's steps/ holds no TensorBoard event files (they were not kept with it); the figures "
                "below are drawn from the runs' metrics.jsonl."
            )
        )
    else:
        blocks.append(para("No TensorBoard event files: no training run finished in this folder."))
    runs = lab.runs("lenet_train")
    if runs:
        figs = []
        for name, fn, caption in (
            ("lenet_loss", plots.loss_curves, "Loss: train per step and per epoch, test per epoch"),
            ("lenet_accuracy", plots.accuracy_curve, "Accuracy: train (running) and test"),
        ):
            png = lab.figure(name, runs[0], fn)
            if png is not None:
                figs.append(Block("img", caption, src=png.name))
        if figs:
            blocks.append(Block("row", children=figs))
    return blocks


def _accuracy(lab: Lab) -> list[Block]:
    blocks = [Block("h4", HEADING["accuracy"], anchor="accuracy")]
    table = [
        [
            "run",
            "activation",
            "layers",
            "epochs",
            "test accuracy",
            f"≥ {HANDOUT_PASS_BAR:.0f} %",
            "time to 99 %",
            "train time",
            "throughput",
        ]
    ]
    for step in ("lenet_train", "gelu_train", "ops_train"):
        for run in lab.runs(step):
            s, c = run.summary, run.config
            acc = s.get("test_accuracy")
            table.append(
                [
                    run.name,
                    str(s.get("act", c.get("act"))),
                    str(s.get("ops", c.get("ops", "aten"))),
                    fmt.count(s.get("epochs")),
                    fmt.pct(acc),
                    "yes" if fmt.is_number(acc) and acc >= HANDOUT_PASS_BAR else "no",
                    fmt.seconds(s.get("time_to_99_seconds"))
                    if s.get("time_to_99_seconds") is not None
                    else "not reached",
                    fmt.seconds(s.get("train_seconds")),
                    fmt.rate(s.get("images_per_s_median")),
                ]
            )
    if len(table) == 1:
        return blocks + [Block("status", "No LeNet-5 run finished.")]
    return blocks + [Block("table", rows=table)]


def _gpt_shape(bench: dict) -> str:
    """The model a benchmark ran, as its plan records it; an old file: its name and sequence only."""
    words = model_words((bench.get("plan") or {}).get("model"))
    if words:
        return words
    seq = f"sequence {fmt.count(bench['seq_len'])}" if fmt.is_number(bench.get("seq_len")) else ""
    return ", ".join(w for w in (str(bench.get("model") or ""), seq) if w) or "shape not recorded"


def _gpt(lab: Lab) -> list[Block]:
    blocks = [Block("h4", HEADING["gpt"], anchor="gpt")]
    base, best = lab.bench("gpt_baseline"), lab.bench("gpt_best")
    ablation = _ablation(lab)
    if not (base or best or ablation):  # nothing measured: no prose about a model that did not run
        return blocks + [Block("status", "No GPT-2 benchmark finished in this lab folder.")] + _details(lab, "gpt")
    blocks.append(
        para(
            f"GPT-2 ({_gpt_shape(best or base or {})}) "
            f"{lab.cite('gpt2')} trained on random tokens, as the handout's baseline does. The baseline is the handout's own code path: HF "
            "GPT2LMHeadModel in fp32 with gradient checkpointing. trainlab's is its own GPT-2 (",
            code("src/trainlab/gpt/model.py"),
            ") with the strategies named in each row: "
            + "; ".join(
                f"{name} = {what}" + (f" {lab.cite(key)}" if key else "")
                for name, what, key, marks in STRATEGY_WORDS
                if lab.strategy_words() & marks
            )
            + ".",
        )
    )
    if ablation is not None:
        blocks += ablation_blocks(ablation.data)
    else:
        benches = [("handout's baseline", "baseline", base)] if base else []
        compare = [r for r in lab.outputs("gpt_strategies")[1] if r.kind == "gpt_bench"]
        benches += [(f"{r.data.get('strategy')}", "strategy", r.data) for r in compare]
        if best:
            benches.append(("trainlab's fastest", "ours", best))
        blocks += bench_rows(benches)
    return blocks + _details(lab, "gpt")


# The handout's 思考 ("think about it") questions, quoted where it asks them
THINK = (
    ("§4.1.2.1", "为什么不用定义反向传播函数呢？ Why does a torch.nn.Module subclass define forward but no backward?"),
    (
        "§4.1.4",
        "测试过程中不需要也不可以计算梯度（思考为什么）: why is no gradient computed, or allowed, while testing?",
    ),
    (
        "§6.5",
        "F.gelu 的实现在 PyTorch 源码的哪个位置: in the student's words, where F.gelu is implemented and how it is reached.",
    ),
)


def _yours(lab: Lab) -> list[Block]:
    """The student's marked places: shown empty, never filled (the handout's §6.3.2 and 思考 questions)."""
    blocks = [
        Block("h2", HEADING["yours"], anchor="yours"),
        para(
            "Everything above is trainlab's record of the run. The handout's report asks for the student's own "
            "account; these places are left for it and are never generated."
        ),
        student("Procedure (§6.3.2.1): what the student did, in their own words"),
        student("Discussion: what the measurements show, and why"),
    ]
    return blocks + [student(f"思考 {where}", q) for where, q in THINK]


def _pretrained(lab: Lab) -> list[Block]:
    return [
        Block("h2", HEADING["pretrained"], anchor="pretrained"),
        para(
            "Every network here starts from random weights drawn from the run's seed: LeNet-5 with PyTorch's default "
            "initialisation; GPT-2, trainlab's and the HF baseline (GPT2LMHeadModel(config), never from_pretrained), with "
            "GPT-2's normal(0, 0.02) initialisation (",
            code("src/trainlab/gpt/model.py"),
            "). No trained weights are "
            "downloaded; the architectures are written in trainlab (LeNet-5, its GPT-2) or are the handout's own baseline.",
        ),
    ]


def _sources(lab: Lab) -> list[Block]:
    return [
        Block("h2", HEADING["sources"], anchor="sources"),
        para(
            "Code trainlab follows: the handout's GPT-2 baseline (GPTLMModel, GPTLMLoss, get_tflops) is the baseline step; "
            "the C++ operator follows PyTorch's C++-extension tutorial; trainlab's GELU kernels follow the formulas of PyTorch's "
            "own, located below. F.gelu has no Python body: it is the C++ operator aten::gelu."
        ),
        Block("table", rows=GELU_SOURCE, text_table=True),
        para(
            "The call path, the kernels' math and how trainlab's map onto them: ", code("docs/gelu-in-pytorch.md"), "."
        ),
    ]


def _extra(lab: Lab) -> list[Block]:
    blocks = [
        Block("h2", HEADING["extra"], anchor="extra"),
        para(
            "Not asked by the handout: LeNet-5's conv2d, max-pool, linear and ReLU written in trainlab (Python, C++, Triton, "
            "CUDA) and checked against ATen; data parallel (DataParallel, DDP, hand-written and ring all-reduce); "
            "torch.compile and CUDA graphs on the LeNet-5 step."
        ),
    ]
    ops = lab.runs("ops_train")
    if ops:
        blocks.append(
            para(f"LeNet-5 on trainlab's operators ({ops[0].summary.get('ops')}): {_accuracy_line(ops[0].summary)}.")
        )
    return blocks + _details(lab, "ops") + _details(lab, "dp")


def _references(lab: Lab) -> list[Block]:
    keys = lab.refs()
    return [
        Block("h2", HEADING["references"], anchor="references"),
        Block(
            "table",
            rows=[["", "reference"]]
            + [[f"[{i}]", REFERENCES[k]] for i, k in enumerate(keys, 1)]
            + [
                [
                    f"[{len(keys) + 1}]",
                    f"trainlab {__version__}: the toolkit that ran every step of this lab and generated this report",
                ]
            ],
            text_table=True,
        ),
    ]


def lab_blocks(root: Path, state: dict, out: Path, student: dict | None = None) -> list[Block]:
    """The page's blocks from results.json: its `plan` (every step of the lab for this hardware, in order,
    as the runner recorded it) and its per-step records; `student`: {"name", "student_id"}."""
    lab = Lab(root, state, out)
    lab.student = {**load_student(root), **(student or {})}
    return (
        _front(lab)
        + _lenet(lab)
        + _gelu(lab)
        + _handin(lab)
        + _pretrained(lab)
        + _sources(lab)
        + _extra(lab)
        + _yours(lab)
        + _references(lab)
    )


def build_lab_report(root: Path, state: dict, out: Path | None = None, student: dict | None = None) -> Path:
    """OUT/index.html and report.md (OUT: DIR/report by default) from DIR/results.json and the steps' outputs."""
    out = Path(root) / "report" if out is None else Path(out)
    out.mkdir(parents=True, exist_ok=True)
    blocks = lab_blocks(Path(root), state, out, student)
    atomic_write_text(out / "index.html", to_html(blocks, blocks[0].text))
    atomic_write_text(out / "report.md", to_markdown(blocks))
    return out / "index.html"
