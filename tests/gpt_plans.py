"""Plans for the GPT tests: a `gpt bench` config resolved on a machine described here (no 'auto')."""

from __future__ import annotations

from dataclasses import replace

from trainlab.gpt.config import GPTBenchConfig
from trainlab.gpt.plan import GPTPlan, Machine
from trainlab.gpt.shape import GPTConfig


def make_plan(
    model: str | GPTConfig = "tiny",
    strategy: str = "none",
    *,
    world: int = 1,
    device: str = "cpu",
    seq_len: int | None = None,
    optimizer: str = "adamw",
    weight_decay: float = 0.0,
    machine: Machine | None = None,
    **bench,
) -> GPTPlan:
    """`GPTBenchConfig(...).plan(machine)`; `model` a preset name or a GPTConfig; `optimizer`/`weight_decay`
    are plan fields no bench flag sets (the equivalence tests' SGD)."""
    name, cfg = (model, None) if isinstance(model, str) else ("tiny", model)
    if machine is None:
        machine = Machine.detect() if device.startswith("cuda") else Machine()
    plan = GPTBenchConfig(model=name, strategy=strategy, nproc=world, device=device, seq=seq_len, **bench).plan(
        machine, model=cfg
    )
    return replace(plan, optimizer=optimizer, weight_decay=weight_decay)
