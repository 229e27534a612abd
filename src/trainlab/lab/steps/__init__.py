"""The lab's deliverables as steps, in priority order, sized to the hardware: one module per part, each
`steps(hw, size) -> [Step]`, a step holding a typed command config (never an argv) from which the line a
student types and the argv the lab runs are derived (`base.Command`).

Each step is one existing command (`trainlab …` or a script of `benchmarks/`) run as a subprocess, so
a hung step can be killed without killing the lab, and a step measures exactly what a student gets by
typing the same line. A step carries its time estimate for this hardware and size, and its hard limit.

Sizes (recorded in results.json with each step):
- `tiny`:  seconds per step, for CI and for trying the command (numbers mean nothing);
- `small`: the CPU hand-in: every step in one 25-minute call on a quiet 2-core CPU, LeNet-5's default
  recipe (≥ 99 %), 2 gloo ranks;
- `full`:  one or more GPUs: the handout's sizes (GPT-2 1.6B, full MNIST, large GELU tensors),
  the parallel steps across every GPU found.

Estimates are seconds: `small` = upper bounds for a quiet 2-core CPU: a quarter of each step's time on
the loaded box of `benchmarks/lab_cpu.md` (load 13–19 on 2 cores, where LeNet-5's recipe ran 65× slower
than on the quiet box, as that file records), so the whole hand-in plans into one 25-minute call —
not yet run end to end on a quiet machine; every run records each step's seconds, CPU seconds and load
(results.json) to recalibrate from. `tiny` = the tiny lab of `tests/test_lab.py`; `full` = measured on one
H100 (benchmarks/results/gpu/h100/lab/results.json, "seconds"; `tests/test_lab_estimates.py` keeps them
within ±30 % of it) and scaled to other GPUs by the data-sheet table (`hardware.Machine.scale`).
On a loaded machine a step's limit grows with the load (`run.load_factor`), so a slow step is not cut.
"""

from __future__ import annotations

from trainlab.hardware import Machine
from trainlab.lab.steps import dp, gelu, gpt, lenet, ops
from trainlab.lab.steps.base import SIZES, Command, Step, repo_root

PARTS = ("lenet", "gelu", "ops", "dp", "gpt")
MODULES = {"lenet": lenet, "gelu": gelu, "ops": ops, "dp": dp, "gpt": gpt}

__all__ = ["PARTS", "SIZES", "Command", "Step", "lab_steps", "repo_root"]


def lab_steps(hw: Machine, size: str) -> list[Step]:
    """Every step of the lab for `hw` at `size`, in priority order (the order they run in)."""
    return [step for part in PARTS for step in MODULES[part].steps(hw, size)]
