"""Exponential moving average (EMA) of a model's weights, the model that is evaluated when `--ema` is on.

After every optimizer step, each floating-point tensor of the state (parameters and BatchNorm running
statistics) moves towards the live model's:

    ema ← ema + (1 − d_t)·(live − ema),   d_t = min(decay, (1 + t) / (N + t))

where t counts the updates so far. The ramp d_t keeps the first steps from averaging in the random
initialization: N = 10 (`--ema-warmup`'s default) is TensorFlow's `ExponentialMovingAverage(num_updates=…)`
and timm's warm-up. It also caps the decay at (1 + T)/(N + T) after T updates: 0.983 after one epoch of
50,000 images at batch 96 (521 steps, the `fast` EMA screen's), a window of ~58 steps whatever `decay`
asks. N = 1 makes the average a plain mean of every weight so far until it reaches `decay`'s window
(1/(1 − decay) steps). Integer buffers (BatchNorm's `num_batches_tracked`) are copied. An average over
the last ~1/(1 − decay) steps smooths the noise of the final, low-learning-rate phase.

The update is device work only (`advance`): the count t lives in a device tensor and d_t is computed
from it there, so the update can be captured inside the training step's CUDA graph (`lenet.step`) and
replayed with it, with no host value frozen into the graph and no launch of its own per step. The host
keeps the same count (`updates`) for the checkpoint, so a resumed run is exact.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn


class EMA:
    """The average of `model` (the plain module: DDP and torch.compile wrap the same parameters)."""

    def __init__(self, model: nn.Module, decay: float, warmup: int = 10):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        if warmup < 1:
            raise ValueError(f"EMA warm-up N must be >= 1, got {warmup}")
        self.decay, self.warmup = decay, warmup
        self.updates = 0
        self.module = copy.deepcopy(model).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.source = model

    @property
    def source(self) -> nn.Module:
        return self._source

    @source.setter
    def source(self, model: nn.Module) -> None:
        # The state tensors are fixed objects (loading a state copies into them), so they are paired once
        # here, not with two state_dict() walks per optimizer step.
        self._source = model
        pairs = list(zip(self.module.state_dict().values(), model.state_dict().values()))
        self._averaged = [e for e, _ in pairs if e.dtype.is_floating_point]
        self._live = [l for e, l in pairs if e.dtype.is_floating_point]
        self._copied = [(e, l) for e, l in pairs if not e.dtype.is_floating_point]
        # float32 counts exactly to 2**24 updates, far past any run here
        self._count = torch.tensor(float(self.updates), device=self._averaged[0].device)

    def current_decay(self) -> float:
        """d_t for the next update: the warm-up ramp, capped at `decay`."""
        return min(self.decay, (1 + self.updates) / (self.warmup + self.updates))

    @torch.no_grad()
    def advance(self) -> None:
        """The update's device work, capturable in a CUDA graph: count, d_t, and the average moved."""
        self._count.add_(1)  # now t + 1, so (1 + t) / (N + t) = count / (count + N - 1)
        weight = 1.0 - torch.clamp(self._count / (self._count + (self.warmup - 1.0)), max=self.decay)
        step = torch._foreach_sub(self._live, self._averaged)  # lerp's weight would be read on the host
        torch._foreach_mul_(step, weight)
        torch._foreach_add_(self._averaged, step)
        for e, l in self._copied:  # integer buffers (num_batches_tracked)
            e.copy_(l)

    def update(self, replayed: bool = False) -> None:
        """Move the average one step towards the live model (after each optimizer step). `replayed`: a
        CUDA graph holding `advance` has just run it; only the host's count is left to keep."""
        if not replayed:
            self.advance()
        self.updates += 1

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates, "model": self.module.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.decay, self.updates = state["decay"], state["updates"]
        self.module.load_state_dict(state["model"])
        self._count.fill_(float(self.updates))  # in place: a captured graph holds this tensor
