"""The package's layering: folders are the workloads, basics sit below them, and no import runs back up.

Layers, bottom to top (a module may import its own layer's modules and anything lower):
  0  errors, stats
  1  io, device, hardware, flags
  2  data, telemetry, distributed
  3  ops
  4  lenet, gpt         (neither imports the other)
  5  report, cli       (report reads result files only: it imports no workload)
  6  lab               (runs the workloads' commands as steps, then the report)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "trainlab"

LAYER = {
    "errors": 0,
    "stats": 0,
    "cuda_driver": 0,
    "text": 0,  # the text gate: errors (layer 0) pass every message through it
    "results": 0,  # the result kinds table: imports nothing of trainlab
    "schema": 1,
    "signals": 2,
    "io": 1,
    "device": 1,
    "hardware": 1,  # the machine facts that need no torch (data sheets, cores)
    "flags": 1,
    "__init__": 0,
    "__main__": 5,
    "data": 2,
    "telemetry": 2,
    "distributed": 2,
    "ops": 3,
    "lenet": 4,
    "gpt": 4,
    "report": 5,
    "cli": 5,
    "lab": 6,
}


def _unit(module: str) -> str:
    """trainlab.gpt.parallel.fsdp → gpt; trainlab.io → io."""
    return module.split(".")[1] if module.count(".") else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainlab"):
            names = [f"{node.module}.{a.name}" if node.module == "trainlab" else node.module for a in node.names]
            out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("trainlab")]
    return out


MODULES = sorted(p for p in SRC.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_import_runs_back_up(path):
    rel = path.relative_to(SRC)
    me = rel.parts[0].removesuffix(".py")
    for line, target in _imports(path):
        unit = _unit(target)
        if unit == "__version__":
            continue
        assert unit in LAYER, f"{rel}:{line} imports {target}: unknown unit {unit!r} (add it to LAYER)"
        assert LAYER[unit] <= LAYER[me], (
            f"{rel}:{line} imports {target}: layer {LAYER[unit]} is above {me}'s {LAYER[me]}"
        )
        assert not (me == "lenet" and unit == "gpt") and not (me == "gpt" and unit == "lenet"), (
            f"{rel}:{line}: workloads are independent"
        )
        assert not (me == "report" and unit in ("lenet", "gpt", "ops")), (
            f"{rel}:{line}: the report reads files, not workloads"
        )


def test_every_workload_folder_is_a_command_group():
    from trainlab.cli import COMMANDS

    assert {where.split(".")[1] for where, _ in COMMANDS.values()} == {"lenet", "data", "ops", "gpt", "report", "lab"}
    for folder in ("lenet", "gpt", "ops", "data", "report", "lab"):
        assert (SRC / folder / "cli.py").exists()
