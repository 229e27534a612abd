"""The lab's report, organised by the handout's deliverables (DIR/report/index.html and report.md).

Front page: where and how the lab ran, the table of steps (estimate against measured time), then one
section per deliverable — LeNet-5 ≥ 98 % with its curves and GPU utilization; GELU in Python, C++ and
on the GPU with the handout's check; the bonus GPT-2 speed, memory and TFLOPS with the speed-up over
the handout's baseline; our own operators; data parallel with the DataLoader-workers study. Each section
shows what its steps measured, or says "not run (why)". Step outputs are read with the same readers
and rendered with the same sections as `trainlab report`, so a table looks the same in both.
"""

from __future__ import annotations

from pathlib import Path

from trainlab.errors import UserError
from trainlab.io import atomic_write_text, contained, read_json
from trainlab.report import format as fmt
from trainlab.report.build import Block, code, para, result_section, run_section, table_from_rows, to_html, to_markdown
from trainlab.report.inputs import ResultFile, TrainingRun, classify, load_run

SECTIONS = (  # part → (heading, what the handout asks for)
    ("lenet", "1. LeNet-5 on MNIST", "Train LeNet-5 to at least 98 % test accuracy; show the loss and accuracy curves "
                                     "and the GPU utilization."),
    ("gelu", "2. GELU in Python, C++ and on the GPU", "Implement GELU three ways and check each against PyTorch: "
                                                       "forward error, |Δloss| and gradient MSE on the handout's recipe."),
    ("gpt", "3. Bonus: GPT-2 speed, memory and TFLOPS", "Train GPT-2 faster than the handout's baseline (HF GPT2LMHeadModel, "
                                                       "fp32, checkpointing): tokens/s, TFLOPS, MFU, peak memory, speed-up."),
    ("ops", "4. Our own operators", "conv2d, max-pool, linear and ReLU written by us, checked against ATen, timed, "
                                    "and used to train LeNet-5."),
    ("dp", "5. Data parallel", "DataParallel, DDP, a hand-written and a ring all-reduce on the same batches, the "
                               "DataLoader-workers study, torch.compile / CUDA graphs and asynchronous timing."),
)
TARGET_ACCURACY = 98.0  # the handout's bar for LeNet-5


def _demote(blocks: list[Block], by: int = 1) -> list[Block]:
    """Sections of `trainlab report` one level down, inside a deliverable's section."""
    for b in blocks:
        if b.kind in ("h2", "h3"):
            b.kind = f"h{int(b.kind[1]) + by}"
    return blocks


def _status_line(name: str, rec: dict | None) -> str | None:
    """None when the step ran and finished ok; else the one line that says why there is nothing."""
    if rec is None:
        return f"{name}: not run (not reached yet: run the same `trainlab lab` command again, or include its part in --parts)"
    status = rec.get("status")
    if status == "ok":
        return None
    if status == "not run":
        return f"{name}: not run: {rec.get('reason')}"
    if status in ("failed", "timed out"):
        return (f"{name}: {status}" + (f" (exit {rec.get('rc')})" if status == "failed" else f" at {fmt.seconds(rec.get('limit_used_s'))}")
                + f" — its log: {rec.get('log')}")
    if status in ("running", "killed", "stopped"):
        return f"{name}: not finished ({status}{': ' + rec['reason'] if rec.get('reason') else ''}); the next call runs it again"
    return f"{name}: {status}"


def _results_in(folder: Path) -> tuple[list[TrainingRun], list[ResultFile], list[tuple[Path, dict]]]:
    """The training runs, the known result files and the other result tables (benchmark scripts'
    {rows: [...]}) a step wrote."""
    runs, known, other = [], [], []
    if not folder.is_dir() or not contained(folder.parent.parent, folder):
        return runs, known, other
    inside = lambda p: contained(folder, p)  # noqa: E731 — a link out of the lab folder is not read
    for p in sorted(filter(inside, folder.rglob("summary.json"))):
        try:
            s = read_json(p)
            if isinstance(s, dict) and "test_accuracy" in s:
                runs.append(load_run(p.parent, s))
        except UserError:
            continue  # a damaged run costs its own section only
    for p in sorted(filter(inside, folder.rglob("*.json"))):
        if p.name in ("summary.json", "config.json", "env.json") or any(r.path in p.parents for r in runs):
            continue
        try:
            data = read_json(p)
        except UserError:
            continue
        kind = classify(data)
        if kind is not None:
            known.append(ResultFile(p, kind, data))
        elif isinstance(data, dict) and isinstance(data.get("rows"), list) or isinstance(data, list):
            other.append((p, data))
    return runs, known, other


def _scalar_table(rows: list[dict], preferred: list[str] | None = None) -> list[list[str]]:
    """A table of the rows' scalar columns (nested dicts and lists stay in the raw file)."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k, v in r.items() if k not in keys and (v is None or isinstance(v, (str, int, float, bool)))]
    if preferred:
        keys = [k for k in preferred if k in keys] or keys
    return table_from_rows(rows, keys)


def _lenet_headline(run: TrainingRun) -> list[Block]:
    s = run.summary
    acc = s.get("test_accuracy")
    met = "met" if isinstance(acc, (int, float)) and acc >= TARGET_ACCURACY else "missed"
    gpu = "its GPU utilization figure is below" if run.gpu else "GPU utilization: not measured (no GPU record: a CPU run)"
    return [para(f"Test accuracy {fmt.pct(acc)} after {fmt.count(s.get('epochs'))} epochs in {fmt.seconds(s.get('train_seconds'))} "
                 f"— the handout's {TARGET_ACCURACY:.0f} % bar: {met}; {gpu}.")]


def _gpt_speedup(base: dict | None, best: dict | None) -> list[Block]:
    """Ours against the handout's baseline: one table with the speed-up column."""
    rows = [(label, d) for label, d in (("handout's baseline (HF, fp32, checkpointing)", base), ("ours, fastest", best)) if d]
    if not rows:
        return []
    ref = base.get("tokens_per_s") if base else None
    table = [["run", "strategy", "throughput", "TFLOP/s per device", "MFU", "peak memory", "speed-up"]]
    for label, d in rows:
        tps = d.get("tokens_per_s")
        speedup = f"{tps / ref:.2f}×" if ref and tps else fmt.MISSING
        table.append([label, str(d.get("strategy", fmt.MISSING)), fmt.value("tokens_per_s", tps),
                      fmt.number(d.get("tflops_per_device")), fmt.value("mfu", d.get("mfu")),
                      fmt.value("peak_memory_bytes", d.get("peak_memory_bytes")), speedup])
    return [Block("table", rows=table)]


def _step_blocks(root: Path, out: Path, name: str, title: str, rec: dict | None, index: int) -> list[Block]:
    blocks = [Block("h3", (rec or {}).get("title") or title)]
    line = _status_line(name, rec)
    if line:
        return blocks + [Block("status", line)]
    folder = root / "steps" / name
    if not contained(root, folder):
        return blocks + [Block("status", f"{name}: steps/{name} is a link out of the lab folder; not read")]
    blocks.append(para(f"Measured in {fmt.seconds(rec.get('seconds'))} (estimate {fmt.seconds(rec.get('estimate_s'))}); command: ",
                       code(rec.get("command", ""))))
    runs, known, other = _results_in(root / "steps" / name)
    for i, run in enumerate(runs):
        if name == "lenet_train":
            blocks += _lenet_headline(run)
        blocks += _demote(run_section(run, out, index * 10 + i, reuse_figures=True), by=2)
    for i, res in enumerate(known):
        blocks += _demote(result_section(res, out, index * 10 + i, reuse_figures=True), by=2)
    for path, data in other:
        rows = data["rows"] if isinstance(data, dict) else data
        rows = [r for r in rows if isinstance(r, dict)]
        if rows:
            blocks.append(para("From ", code(path.relative_to(root)), ":"))
            blocks.append(Block("table", rows=_scalar_table(rows)))
    if not (runs or known or other):
        log = root / "steps" / name / "log.txt"
        tail = _log_tail(root, log)
        blocks.append(Block("pre", "\n".join(tail)))
    return blocks


def _log_tail(root: Path, log: Path, lines: int = 15, max_bytes: int = 64 * 1024) -> list[str]:
    """The last lines of a step's log: its last `max_bytes` only, and only a file inside the lab folder."""
    if not log.is_file() or not contained(root, log):
        return []
    try:
        with open(log, "rb") as f:
            f.seek(max(0, log.stat().st_size - max_bytes))
            return f.read(max_bytes).decode(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def _bench(root: Path, name: str, state: dict) -> dict | None:
    if (state["steps"].get(name) or {}).get("status") != "ok":
        return None
    f = root / "steps" / name / "bench.json"
    if not contained(root, f):
        return None
    try:
        d = read_json(f)
    except UserError:
        return None
    return d if isinstance(d, dict) else None


def _headline(root: Path, part: str, state: dict) -> str:
    """The one number of a deliverable, where its step ran."""
    if part == "lenet":
        runs, _, _ = _results_in(root / "steps" / "lenet_train") if (state["steps"].get("lenet_train") or {}).get("status") == "ok" else ([], 0, 0)
        if runs:
            acc = runs[0].summary.get("test_accuracy")
            met = "met" if isinstance(acc, (int, float)) and acc >= TARGET_ACCURACY else "missed"
            return f"test accuracy {fmt.pct(acc)} ({TARGET_ACCURACY:.0f} % bar {met})"
    if part == "gpt":
        base, best = _bench(root, "gpt_baseline", state), _bench(root, "gpt_best", state)
        if base and best and base.get("tokens_per_s") and best.get("tokens_per_s"):
            return f"ours {best['tokens_per_s'] / base['tokens_per_s']:.2f}× the handout's baseline ({best.get('strategy')})"
    return ""


def _at_a_glance(root: Path, state: dict, plan: list[dict]) -> list[list[str]]:
    rows = [["deliverable", "steps ok", "not run or failed", "headline"]]
    for part, title, _ in SECTIONS:
        names = [p["name"] for p in plan if p["part"] == part]
        ok = [n for n in names if (state["steps"].get(n) or {}).get("status") == "ok"]
        rest = [f"{n} ({(state['steps'].get(n) or {}).get('status', 'not reached')})" for n in names if n not in ok]
        rows.append([title, f"{len(ok)} of {len(names)}", ", ".join(rest) or "–", _headline(root, part, state) or "–"])
    return rows


def lab_blocks(root: Path, state: dict, out: Path) -> list[Block]:
    """The page's blocks from results.json: its `plan` (every step of the lab for this hardware, in order,
    as the runner recorded it) and its per-step records."""
    hw = state.get("hardware") or {}
    recs = state["steps"]
    plan = state.get("plan") or [{"name": n, "part": r.get("part"), "title": r.get("title", n),
                                  "estimate_s": r.get("estimate_s"), "limit_s": r.get("limit_s"), "sizes": r.get("sizes") or {}}
                                 for n, r in recs.items()]
    blocks = [Block("h1", f"trainlab lab — {hw.get('name', 'unknown device')}")]
    ran = [r for r in recs.values() if r.get("status") == "ok"]
    blocks.append(para(f"Hardware: {hw.get('name')} ({hw.get('kind')}, {hw.get('gpus')} GPU(s), {hw.get('cpus')} CPU cores); "
                       f"size {state.get('size')}; {len(ran)} of {len(plan)} steps ok over {len(state.get('calls', []))} call(s)."))
    data = state.get("data") or {}
    if data and not data.get("official", True):
        blocks.append(Block("note", f"Data: --mnist {data.get('line')}"))
    blocks.append(Block("toc", links=[(title, part) for part, title, _ in SECTIONS] + [("Steps: estimate against measured", "steps")]))
    blocks.append(Block("table", rows=_at_a_glance(root, state, plan)))
    for index, (part, title, asks) in enumerate(SECTIONS):
        blocks.append(Block("h2", title, anchor=part))
        blocks.append(para("The handout: " + asks))
        if part == "gpt":
            blocks += _gpt_speedup(_bench(root, "gpt_baseline", state), _bench(root, "gpt_best", state))
        for i, step in enumerate(s for s in plan if s["part"] == part):
            blocks += _step_blocks(root, out, step["name"], step["title"], recs.get(step["name"]), index * 100 + i)
    blocks.append(Block("h2", "Steps: estimate against measured", anchor="steps"))
    table = [["step", "part", "status", "estimate", "measured", "measured / estimate", "limit", "sizes"]]
    for s in plan:
        r = recs.get(s["name"]) or {}
        sec, est = r.get("seconds"), r.get("estimate_s", s["estimate_s"])  # the estimate the step ran under
        table.append([s["name"], str(s["part"]), r.get("status", "not reached") + (f": {r['reason']}" if r.get("reason") else ""),
                      fmt.seconds(est), fmt.seconds(sec), f"{sec / est:.2f}" if sec and est else fmt.MISSING,
                      fmt.seconds(r.get("limit_s", s["limit_s"])), ", ".join(f"{k} {v}" for k, v in s["sizes"].items())])
    blocks.append(Block("table", rows=table))
    for c in state.get("calls", []):
        blocks.append(para(f"{c.get('started_utc')}: budget {fmt.seconds(c.get('budget_s'))}, used {fmt.seconds(c.get('used_s'))}: ",
                           code(c.get("command", ""))))
    return blocks


def build_lab_report(root: Path, state: dict) -> Path:
    """DIR/report/index.html and report.md from DIR/results.json and the steps' outputs."""
    out = Path(root) / "report"
    out.mkdir(parents=True, exist_ok=True)
    blocks = lab_blocks(Path(root), state, out)
    atomic_write_text(out / "index.html", to_html(blocks, blocks[0].text))
    atomic_write_text(out / "report.md", to_markdown(blocks))
    return out / "index.html"

