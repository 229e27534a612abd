"""Shared by the benchmark scripts: where results go, the command line, and the one result writer.

Every script takes `--out DIR` (default benchmarks/results, the committed results) and refuses, before
it measures anything, to overwrite result files that already exist there unless `--force` is given.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from trainlab.io import set_force
from trainlab.results.kinds import plan_record
from trainlab.telemetry.results import write_results

RESULTS = Path(__file__).resolve().parent / "results"


def command_line() -> str:
    return " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *map(shlex.quote, sys.argv[1:])])


def add_output_args(ap: argparse.ArgumentParser, flag: str = "--out") -> None:
    ap.add_argument(flag, default=str(RESULTS), help="directory for the result files (default: benchmarks/results)")
    ap.add_argument("--force", action="store_true", help="overwrite result files that already exist there")


def check_output(out: str | Path, *stems: str, force: bool = False) -> Path:
    """Exit with one line if <out>/<stem>.{json,md,log} exists and --force was not given."""
    out = Path(out)
    existing = [out / f"{s}.{ext}" for s in stems for ext in ("json", "md", "log") if (out / f"{s}.{ext}").exists()]
    if existing and not force:
        sys.exit(
            f"{Path(sys.argv[0]).name}: error: {existing[0]} exists; pass --force to overwrite it, "
            "or --out DIR to write elsewhere"
        )
    set_force(force)  # trainlab.io's writers refuse files they did not write (committed results) unless forced
    return out


def save(
    name: str,
    rows,
    markdown: str,
    log_lines: list[str],
    device=None,
    out: str | Path = RESULTS,
    kind: str = "benchmark",
) -> None:
    """Write <out>/<name>.json (rows + env + command), .md (the table) and .log (raw log)."""
    plan = plan_record(str(device) if device is not None else "cpu", threads=torch.get_num_threads())
    write_results(out, name, rows, markdown, log_lines, command_line(), kind=kind, plan=plan, device=device)
    print(f"wrote {out}/{name}.{{json,md,log}}")
