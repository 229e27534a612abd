"""Shared by the benchmark scripts: where results go, and the header every raw log starts with."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from trainlab.io import atomic_write_json, atomic_write_text
from trainlab.telemetry.env import collect_env

RESULTS = Path(__file__).resolve().parent / "results"


def command_line() -> str:
    return " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *map(shlex.quote, sys.argv[1:])])


def save(name: str, rows, markdown: str, log_lines: list[str], device=None) -> None:
    """Write results/<name>.json (rows + env + command), .md (the table) and .log (raw log)."""
    env = collect_env(device)
    cmd = command_line()
    atomic_write_json(RESULTS / f"{name}.json", {"command": cmd, "env": env, "rows": rows})
    machine = f"{env['cpu']} ({env['cpu_count']} cores)" + (f", GPU {', '.join(env['gpus'])}" if env["gpus"] else ", no GPU")
    atomic_write_text(RESULTS / f"{name}.md", f"Command: `{cmd}`  \nMachine: {machine}; torch {env['torch']}; {env['time_utc']}\n\n{markdown}\n")
    atomic_write_text(RESULTS / f"{name}.log", "\n".join([f"$ {cmd}", f"# {machine}", *log_lines]) + "\n")
    print(f"wrote {RESULTS}/{name}.{{json,md,log}}")
