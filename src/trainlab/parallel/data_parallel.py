"""How the LeNet-5 trainer runs data-parallel: one object the training loop asks four questions.

- which rank am I and where do I compute (`rank`, `world_size`, `device`, `is_main`)
- `wrap(model)`: DataParallel / DDP wrapper, or the model itself
- `after_backward(model)`: the hand-written all-reduce (no-op for the other modes)
- `mean(value)`: average a scalar tensor over ranks (for logging)

Modes: none (single process), dp (nn.DataParallel), ddp (DistributedDataParallel), allreduce
(hand-written bucketed all-reduce). The loop stays the same for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from trainlab.device import resolve_device
from trainlab.errors import ConfigError

MODES = ("none", "dp", "ddp", "allreduce")


@dataclass
class DataParallelContext:
    mode: str = "none"
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def after_backward(self, model: nn.Module) -> None:
        pass

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        return value

    def close(self) -> None:
        pass


def setup_data_parallel(mode: str, device: str, global_batch: int) -> DataParallelContext:
    """Resolve `--parallel MODE` into a context; errors before anything starts."""
    if mode not in MODES:
        raise ConfigError(f"--parallel {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "none":
        return DataParallelContext(mode="none", device=resolve_device(device))
    raise ConfigError(f"--parallel {mode}: not available in this build")
