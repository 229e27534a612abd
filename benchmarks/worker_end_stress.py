"""Stress the end of a 2-process run: back-to-back `trainlab dp compare --modes ddp --nproc 2` runs
(tiny sizes) while busy loops keep every core loaded; counts the runs that hang.

A gloo worker could block for good in the process-group destructor once its results were written (a
2-process `dp compare` was seen to sit in a futex wait for 15 minutes). Workers now end one way
(`distributed.launch.end_worker`: results written, a barrier with a timeout, `os._exit`). A run whose
working processes used no CPU for `--idle` seconds counts as hung (a loaded box only slows a run; a
hung rank uses none) and is stopped so the loop goes on; one still working at `--cap` counts as slow.
A run that returned but had to stop a rank at the end (a row with a "note") is counted apart.
`--before SRC` interleaves runs of another checkout's code (the old code), run by run, so both see
the same load.

    nice -n 15 python benchmarks/worker_end_stress.py --runs 50
    git worktree add --detach /tmp/old 92dbce4
    nice -n 15 python benchmarks/worker_end_stress.py --runs 20 --before /tmp/old/src --name worker_end_stress_vs_before

Target (issue 19): no hang in 50 runs on a loaded box.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import add_output_args, check_output, save

from trainlab.distributed.launch import stop_tree

DP_ARGS = [
    "dp",
    "compare",
    "--modes",
    "ddp",
    "--nproc",
    "2",
    "--epochs",
    "1",
    "--device",
    "cpu",
    "--train-subset",
    "256",
    "--test-subset",
    "100",
    "--batch-size",
    "64",
    "--workers",
    "",
]


def busy_loops(n: int) -> list[subprocess.Popen]:
    """`n` spinning processes at the lowest priority: every core stays busy, the runs still progress."""
    return [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _tree(pid: int) -> list[int]:
    found, todo = [pid], [pid]
    while todo:
        for children in Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            try:
                kids = [int(k) for k in children.read_text().split()]
            except (OSError, ValueError):
                continue
            found += kids
            todo += kids
    return found


def _working_cpu_s(pid: int) -> float:
    """CPU seconds used so far by the run's processes that do the work: all of them, except torchrun's
    agent once it has workers (it polls them every 0.1 s, so it never looks idle)."""
    total = 0.0
    for p in _tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            if "torch.distributed.run" in Path(f"/proc/{p}/cmdline").read_text() and len(_tree(p)) > 1:
                continue
            total += (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            continue
    return total


def one_run(i: int, variant: str, src: str | None, idle_s: float, cap_s: float, tmp: Path) -> dict:
    """One run; "hang" when its working processes used no CPU for `idle_s` (a loaded box slows a run,
    a hung rank sits in a futex wait), "slow" when it is still busy at `cap_s`."""
    out = tmp / f"run{i}.json"
    log = tmp / f"run{i}.log"
    env = dict(os.environ, **({"PYTHONPATH": src} if src else {}))
    t0 = time.monotonic()
    status = None
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainlab", *DP_ARGS, "--json", str(out)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        )
        cpu, last_progress = -1.0, time.monotonic()
        try:
            while proc.poll() is None:
                now_cpu = _working_cpu_s(proc.pid)
                if now_cpu > cpu + 0.05:
                    cpu, last_progress = now_cpu, time.monotonic()
                if time.monotonic() - last_progress > idle_s:
                    status = "hang"
                elif time.monotonic() - t0 > cap_s:
                    status = "slow"
                if status:
                    break
                time.sleep(2)
        finally:
            if proc.poll() is None:  # the run and every process under it (torchrun's workers too)
                stop_tree(proc)
    wall = time.monotonic() - t0
    rc = proc.returncode if status is None else None
    rows = json.loads(out.read_text()) if out.exists() else []
    notes = [r.get("note") for r in rows if r.get("note")]
    if status is None:
        status = "ok" if rc == 0 and rows and all(r.get("status", "ok") == "ok" for r in rows) else "failed"
    tail = "" if status == "ok" else log.read_text()[-600:]
    return {"run": i, "variant": variant, "status": status, "rc": rc, "wall_s": wall, "notes": notes, "tail": tail}


def _commit(src: str) -> str:
    return (
        subprocess.run(
            ["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "?"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=50, help="runs of each variant (default 50)")
    ap.add_argument(
        "--before",
        metavar="SRC",
        default=None,
        help="also run the trainlab in SRC (e.g. a checkout of the old code's src/), interleaved run by run",
    )
    ap.add_argument(
        "--idle", type=float, default=90.0, help="a run whose working processes used no CPU this long is hung"
    )
    ap.add_argument("--cap", type=float, default=900.0, help="a run still busy after this long is stopped as slow")
    ap.add_argument("--budget", type=float, default=None, help="start no new run after this many seconds")
    ap.add_argument(
        "--busy", type=int, default=os.cpu_count() or 1, help="busy loops beside the runs (default: one per core)"
    )
    ap.add_argument("--name", default="worker_end_stress", help="result file stem")
    add_output_args(ap)
    args = ap.parse_args()
    out = check_output(args.out, args.name, force=args.force)
    import trainlab

    here = str(Path(trainlab.__file__).parent.parent)
    variants = [("this", None, _commit(here))] + (
        [("before", args.before, _commit(args.before))] if args.before else []
    )
    lines = [
        f"{len(variants)} variant(s): "
        + ", ".join(f"{v} = {c}" for v, _, c in variants)
        + f"; {args.runs} runs each, interleaved; hung = no CPU for {args.idle:g} s; slow = busy at {args.cap:g} s; "
        f"{args.busy} busy loop(s), {os.cpu_count()} cores (a shared box, loaded by others too)",
        "$ python -m trainlab " + " ".join(DP_ARGS[:-1]) + " '' --json RUN.json",
    ]
    print(lines[0], flush=True)
    busy = busy_loops(args.busy)
    results, t_start = [], time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="worker_end_stress_") as tmp:
            for i in range(args.runs * len(variants)):
                if args.budget is not None and time.monotonic() - t_start > args.budget:
                    lines.append(f"budget of {args.budget:g} s spent: stopped after {i} runs")
                    print(lines[-1], flush=True)
                    break
                name, src, _ = variants[i % len(variants)]
                r = one_run(i, name, src, args.idle, args.cap, Path(tmp))
                results.append(r)
                lines.append(
                    f"run {i + 1:>3} ({name}): {r['status']:<6} rc {r['rc']}  {r['wall_s']:6.1f} s"
                    + (f"  notes: {r['notes']}" if r["notes"] else "")
                    + (f"\n{r['tail']}" if r["tail"] else "")
                )
                print(lines[-1], flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    summary, md_rows = [], []
    for name, _, commit in variants:
        mine = [r for r in results if r["variant"] == name]
        count = {st: sum(r["status"] == st for r in mine) for st in ("ok", "hang", "slow", "failed")}
        walls = [r["wall_s"] for r in mine if r["status"] in ("ok", "failed")]
        row = {
            "variant": name,
            "commit": commit,
            "runs": len(mine),
            **count,
            "runs_with_a_stopped_rank": sum(bool(r["notes"]) for r in mine),
            "wall_s_median": statistics.median(walls) if walls else None,
            "wall_s_max": max(walls) if walls else None,
        }
        summary.append(row)
        md_rows.append(
            f"| {name} ({commit}) | {row['runs']} | {count['ok']} | {count['hang']} | {count['slow']} | "
            f"{count['failed']} | {row['runs_with_a_stopped_rank']} | {row['wall_s_median'] or 0:.1f} / "
            f"{row['wall_s_max'] or 0:.1f} |"
        )
    md = (
        "| code | runs | ok | hung | slow | failed | rank stopped at the end | wall s median / max |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n" + "\n".join(md_rows) + "\n\n"
        f"2-process `trainlab dp compare --modes ddp` (gloo, CPU, 256 images), {args.busy} busy loop(s) at nice 19 "
        f"beside the runs, on a shared {os.cpu_count()}-core box (loaded by other work too); variants interleaved run "
        f"by run. Hung: the run's working processes used no CPU for {args.idle:g} s (then stopped); slow: still "
        f"working after {args.cap:g} s.\n"
    )
    lines.append(json.dumps(summary))
    print(md)
    save(args.name, {"summary": summary, "runs": results}, md, lines, out=out)


if __name__ == "__main__":
    main()
