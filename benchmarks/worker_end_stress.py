"""Stress the end of a 2-process run: N back-to-back `trainlab dp compare --modes ddp --nproc 2` runs
(tiny sizes) while busy loops keep every core loaded; counts the runs that hang.

A gloo worker could block for good in the process-group destructor once its results were written (a
2-process `dp compare` was seen to sit in a futex wait for 15 minutes). Workers now end one way
(`distributed.launch.end_worker`: results written, a barrier with a timeout, `os._exit`). A run that
has not returned after `--cap` seconds counts as a hang; its process group is then killed so the loop
goes on. A run that returned but had to stop a rank at the end (a row with a "note") is counted apart.

    nice -n 15 python benchmarks/worker_end_stress.py --runs 50
    # the code before the change (92dbce4) was measured by this script's first version, which stopped a
    # hung run with os.killpg on a session of its own (stop_tree did not exist there)

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

DP_ARGS = ["dp", "compare", "--modes", "ddp", "--nproc", "2", "--epochs", "1", "--device", "cpu", "--train-subset", "256",
           "--test-subset", "100", "--batch-size", "64", "--workers", ""]


def busy_loops(n: int) -> list[subprocess.Popen]:
    """`n` spinning processes at the lowest priority: every core stays busy, the runs still progress."""
    return [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def one_run(i: int, cap_s: float, tmp: Path) -> dict:
    out = tmp / f"run{i}.json"
    log = tmp / f"run{i}.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "trainlab", *DP_ARGS, "--json", str(out)], stdout=f,
                                stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=cap_s)
            hung = False
        except subprocess.TimeoutExpired:
            rc, hung = None, True
        finally:
            if proc.poll() is None:  # the run and every process under it (torchrun's workers too)
                stop_tree(proc)
    wall = time.monotonic() - t0
    rows = json.loads(out.read_text()) if out.exists() else []
    notes = [r.get("note") for r in rows if r.get("note")]
    status = "hang" if hung else ("ok" if rc == 0 and rows and all(r.get("status", "ok") == "ok" for r in rows) else "failed")
    tail = "" if status == "ok" else log.read_text()[-600:]
    return {"run": i, "status": status, "rc": rc, "wall_s": wall, "notes": notes, "tail": tail}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--cap", type=float, default=300.0, help="seconds after which a run counts as hung (default 300)")
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy loops beside the runs (default: one per core)")
    ap.add_argument("--name", default="worker_end_stress", help="result file stem")
    add_output_args(ap)
    args = ap.parse_args()
    out = check_output(args.out, args.name, force=args.force)
    import trainlab

    code = subprocess.run(["git", "-C", str(Path(trainlab.__file__).parent), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    lines = [f"trainlab from {trainlab.__file__} (commit {code or '?'}), {args.runs} runs, cap {args.cap:g} s, "
             f"{args.busy} busy loop(s), {os.cpu_count()} cores (a shared box, loaded by others too)",
             "$ python -m trainlab " + " ".join(DP_ARGS[:-1]) + " '' --json RUN.json"]
    print(lines[0], flush=True)
    busy = busy_loops(args.busy)
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="worker_end_stress_") as tmp:
            for i in range(args.runs):
                r = one_run(i, args.cap, Path(tmp))
                results.append(r)
                lines.append(f"run {i + 1:>3}/{args.runs}: {r['status']:<6} rc {r['rc']}  {r['wall_s']:6.1f} s"
                             + (f"  notes: {r['notes']}" if r["notes"] else "") + (f"\n{r['tail']}" if r["tail"] else ""))
                print(lines[-1], flush=True)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    count = {s: sum(r["status"] == s for r in results) for s in ("ok", "hang", "failed")}
    noted = sum(bool(r["notes"]) for r in results)
    walls = [r["wall_s"] for r in results if r["status"] != "hang"]
    summary = {"commit": code, "runs": args.runs, "cap_s": args.cap, "busy_loops": args.busy, **count,
               "runs_with_a_stopped_rank": noted, "wall_s_median": statistics.median(walls) if walls else None,
               "wall_s_max": max(walls) if walls else None}
    md = ("| code | runs | ok | hung (> cap) | failed | rank stopped at the end | wall s median / max |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
          f"| {code} | {args.runs} | {count['ok']} | {count['hang']} | {count['failed']} | {noted} | "
          f"{summary['wall_s_median'] or 0:.1f} / {summary['wall_s_max'] or 0:.1f} |\n\n"
          f"2-process `trainlab dp compare --modes ddp` (gloo, CPU, 256 images), {args.busy} busy loop(s) at nice 19 "
          f"beside the runs, on a shared {os.cpu_count()}-core box (loaded); a run not back after {args.cap:g} s counts as hung.\n")
    lines.append(json.dumps(summary))
    print(md)
    save(args.name, {"summary": summary, "runs": results}, md, lines, out=out)


if __name__ == "__main__":
    main()
