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

After every step: results.json, the report (DIR/report/index.html, `trainlab.report.lab`) and one
archive of it all (DIR/lab.tar.gz, ≤ ARCHIVE_MAX_BYTES) for copying off a remote machine. Extension
builds and the Triton cache go to DIR/cache (TRAINLAB_CACHE for every step), so a resumed call does
not rebuild them.
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

from trainlab.distributed.launch import stop_tree
from trainlab.errors import UserError
from trainlab.io import atomic_write_bytes, atomic_write_json, read_json
from trainlab.lab.steps import PARTS, Hardware, Step, lab_steps, repo_root

RESULTS = "results.json"
ARCHIVE = "lab.tar.gz"
ARCHIVE_MAX_BYTES = 16 * 2**20
STATE_VERSION = 1
FINISHED = ("ok", "failed", "timed out")   # kept by a resumed call; anything else runs again
KILL_GRACE_S = 10                           # SIGTERM, then this long before SIGKILL


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
    if not f.exists():
        return {"version": STATE_VERSION, "steps": {}, "calls": []}
    state = read_json(f)
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION or not isinstance(state.get("steps"), dict):
        raise UserError(f"{f}: not a trainlab lab results file (version {STATE_VERSION}); give a new --out DIR")
    return state


def save_state(root: Path, state: dict) -> None:
    atomic_write_json(root / RESULTS, state)


def step_record(root: Path, step: Step, **extra) -> dict:
    command = " ".join(step.argv).replace("{out}", str(step_dir(root, step.name)))
    return {"part": step.part, "title": step.title, "estimate_s": step.estimate_s, "limit_s": step.limit_s,
            "command": command, "sizes": step.sizes, **extra}


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


def format_plan(rows: list[dict], hw: Hardware, size: str, budget_s: float) -> str:
    from trainlab.report.format import seconds

    total = sum(r["estimate_s"] for r in rows if r["plan"].startswith("runs"))
    lines = [f"lab plan: {hw.name} ({hw.kind}, {hw.gpus} GPU(s), peak "
             f"{f'{hw.peak_tflops:g} TFLOP/s' if hw.peak_tflops else 'unknown'}), size {size}, budget {seconds(budget_s)}",
             f"{'step':<20} {'part':<6} {'estimate':>9} {'limit':>8}  plan"]
    lines += [f"{r['step']:<20} {r['part']:<6} {seconds(r['estimate_s']):>9} {seconds(r['limit_s']):>8}  {r['plan']}" for r in rows]
    lines.append(f"estimated: {seconds(total)} of {seconds(budget_s)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ processes

def _set_parent_death_signal() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the step dies with the lab (a SIGKILLed lab must not leave its step running on)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


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


def step_env(root: Path, hw: Hardware) -> dict:
    env = dict(os.environ)
    src = str(repo_root() / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TRAINLAB_CACHE"] = str(root / "cache")
    env["TRITON_CACHE_DIR"] = str(root / "cache" / "triton")
    env["PYTHONUNBUFFERED"] = "1"
    if hw.kind == "cuda":
        env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # less fragmentation at 1.6B
    return env


def prepare_cache(root: Path, mnist_pack: str | None) -> None:
    """DIR/cache/mnist: the given pack, else the MNIST cache this user already has (linked, not copied,
    so a lab does not convert MNIST again), else nothing (the first step converts it)."""
    from trainlab.data.mnist import default_cache_dir

    target = root / "cache" / "mnist"
    target.parent.mkdir(parents=True, exist_ok=True)
    if mnist_pack:
        target.mkdir(exist_ok=True)
        if not (target / "mnist.npz").exists():
            shutil.copyfile(mnist_pack, target / "mnist.npz")
        return
    if target.exists() or target.is_symlink():
        return
    mine = default_cache_dir()
    carried = repo_root() / ".cache" / "mnist.npz"
    if mine.is_dir() and mine.resolve() != target.resolve():
        target.symlink_to(mine.resolve(), target_is_directory=True)
    elif carried.exists():
        target.mkdir()
        shutil.copyfile(carried, target / "mnist.npz")


def run_step(root: Path, step: Step, limit_s: float, env: dict, state: dict, on_start) -> dict:
    """Run one step in its partial folder; rename it into place when it ends. Returns its record."""
    partial = _partial_dir(root, step.name)
    if partial.exists():
        shutil.rmtree(partial)  # a killed call's leftovers: trainlab's own folder, by its reserved name
    partial.mkdir(parents=True)
    argv = [a.replace("{out}", str(partial)) for a in step.argv]
    log_path = partial / "log.txt"
    t0 = _now()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        out = open(partial / step.stdout_file, "w") if step.stdout_file else log
        try:
            # cwd: the step's own folder, so whatever a step writes to a relative path stays in the lab
            proc = subprocess.Popen(argv, stdout=out, stderr=log, stdin=subprocess.DEVNULL, env=env, cwd=partial,
                                    start_new_session=True, preexec_fn=_set_parent_death_signal)
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
    seconds = _now() - t0
    final = step_dir(root, step.name)
    if final.exists():
        shutil.rmtree(final)  # a failed earlier attempt rerun on purpose; this folder is the lab's own
    os.replace(partial, final)
    if timed_out:
        status = "timed out"
    elif rc == 0:
        status = "ok"
    else:
        status = "failed"
    return {"status": status, "rc": rc, "seconds": round(seconds, 2), "limit_used_s": round(limit_s, 1),
            "log": str(Path("steps") / step.name / "log.txt")}


# ------------------------------------------------------------------------------ after every step

def write_outputs(root: Path, state: dict) -> None:
    from trainlab.report.lab import build_lab_report

    save_state(root, state)
    build_lab_report(root, state)
    write_archive(root)


def write_archive(root: Path) -> Path:
    """DIR/lab.tar.gz: results.json, the report, then every step's files, smallest first, up to
    ARCHIVE_MAX_BYTES (compressed); what did not fit is listed in ARCHIVE_LEFT_OUT.txt inside it."""
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()
             and p.relative_to(root).parts[0] not in ("cache",) and p.name != ARCHIVE
             and not any(part.endswith(".partial") for part in p.relative_to(root).parts)
             and not p.name.startswith(".")]
    first = [p for p in files if p.name == RESULTS or p.relative_to(root).parts[0] == "report"]
    rest = sorted((p for p in files if p not in first), key=lambda p: p.stat().st_size)
    buf = io.BytesIO()
    left_out = []
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in first + rest:
            if buf.tell() + p.stat().st_size // 2 > ARCHIVE_MAX_BYTES - 2**20:
                left_out.append(f"{p.relative_to(root)} ({p.stat().st_size:,} bytes)")
                continue
            tar.add(p, arcname=str(Path(root.name) / p.relative_to(root)))
        if left_out:
            note = ("Left out to keep this archive under 16 MiB (they stay in the lab folder):\n" + "\n".join(left_out) + "\n").encode()
            info = tarfile.TarInfo(str(Path(root.name) / "ARCHIVE_LEFT_OUT.txt"))
            info.size = len(note)
            tar.addfile(info, io.BytesIO(note))
    return atomic_write_bytes(root / ARCHIVE, buf.getvalue())


# ------------------------------------------------------------------------------ the call

def run_lab(root: Path, hw: Hardware, size: str, budget_s: float, parts: list[str], command: str,
            mnist_pack: str | None = None, log=None, started_at: float | None = None) -> dict:
    """One call of the lab: its budget counts from `started_at` (the CLI passes its process's start, so
    start-up counts too), or from now."""
    log = log or (lambda line: print(line, flush=True))  # flushed: a user watches it through a pipe or a log file
    # absolute once, here: every path handed to a step (its {out}, the caches) is then absolute, and the
    # steps run in their own folders, not in the caller's working folder
    root = Path(os.path.abspath(root))
    mnist_pack = os.path.abspath(mnist_pack) if mnist_pack else None
    root.mkdir(parents=True, exist_ok=True)
    state = load_state(root)
    if state.get("size") not in (None, size) or state.get("hardware", {}).get("kind") not in (None, hw.kind):
        raise UserError(f"--out {root}: holds a lab run at size {state.get('size')} on "
                        f"{state.get('hardware', {}).get('kind')}; this call is size {size} on {hw.kind}: give a new --out DIR")
    state.update(size=size, hardware=hw.to_dict(), parts_known=list(PARTS))
    start = _now() if started_at is None else started_at
    call = {"command": command, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)), "budget_s": budget_s,
            "parts": parts}
    state["calls"].append(call)
    prepare_cache(root, mnist_pack)
    env = step_env(root, hw)
    steps = lab_steps(hw, size)
    # every step of the lab here, in order: the report shows the ones not reached yet too
    state["plan"] = [{"name": s.name, "part": s.part, "title": s.title, "estimate_s": s.estimate_s, "limit_s": s.limit_s,
                      "sizes": s.sizes} for s in steps]
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
        limit = min(step.limit_s, left)
        log(f"lab: {step.name}: running (estimate {step.estimate_s:.0f} s, limit {limit:.0f} s) — {step.title}")

        def started(pid, step=step):
            state["steps"][step.name] = step_record(root, step, status="running", pgid=pid, started_utc=time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            save_state(root, state)

        rec = run_step(root, step, limit, env, state, started)
        if rec["status"] == "timed out" and limit < step.limit_s:
            rec.update(status="stopped", reason=f"budget ran out after {rec['seconds']:.0f} s; runs again in the next call")
        state["steps"][step.name] = step_record(root, step, **rec)
        log(f"lab: {step.name}: {rec['status']} in {rec['seconds']:.0f} s" + (f" (exit {rec['rc']})" if rec["status"] == "failed" else "")
            + (f" — see {root / rec['log']}" if rec["status"] != "ok" else ""))
        call["used_s"] = round(_now() - start, 1)
        t0 = _now()
        write_outputs(root, state)
        reserve = max(reserve, 2.0 * (_now() - t0))
    call["used_s"] = round(_now() - start, 1)
    write_outputs(root, state)
    done = sum(1 for s in state["steps"].values() if s.get("status") == "ok")
    log(f"lab: {done} of {len(steps)} steps ok; results {root / RESULTS}, report {root / 'report' / 'index.html'}, "
        f"archive {root / ARCHIVE}")
    return state

