"""Mixed precision: bf16 autocast, or fp16 autocast with a gradient scaler.

Master weights, gradients and optimizer states stay fp32 in every case; autocast runs the matmuls
in 16-bit. bf16 has fp32's exponent range and needs no loss scaling; fp16 does, so it gets a
`GradScaler` (a `ShardedGradScaler` under FSDP2, which all-reduces the found-inf flag because each
rank sees only its gradient shard).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """Wraps forward (autocast), backward (loss scaling) and the optimizer step for one precision."""

    def __init__(self, amp: str | None, device: torch.device, sharded: bool = False, process_group=None):
        self.amp = amp
        self.device = torch.device(device)
        self.dtype = AMP_DTYPES.get(amp, torch.float32)
        self.scaler = None
        if amp == "fp16":
            if sharded:
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

                kwargs = {"process_group": process_group} if process_group is not None else {}
                self.scaler = ShardedGradScaler(device=self.device.type, **kwargs)
            else:
                self.scaler = torch.amp.GradScaler(self.device.type)

    def autocast(self):
        """Context for the forward pass and the loss (backward needs no autocast)."""
        if self.amp is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Optimizer step; with fp16 skipped (and the scale lowered) when a gradient overflowed."""
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()
