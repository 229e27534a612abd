"""Shared by the benchmark scripts: where results go, the command line, and the one result writer."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from trainlab.telemetry.results import write_results

RESULTS = Path(__file__).resolve().parent / "results"


def command_line() -> str:
    return " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *map(shlex.quote, sys.argv[1:])])


def save(name: str, rows, markdown: str, log_lines: list[str], device=None) -> None:
    """Write results/<name>.json (rows + env + command), .md (the table) and .log (raw log)."""
    write_results(RESULTS, name, rows, markdown, log_lines, command_line(), device=device)
    print(f"wrote {RESULTS}/{name}.{{json,md,log}}")
