"""Model wrappers: DistributedDataParallel for any `nn.Module`, gradient-sync control for
accumulation, and the one `unwrap` that finds the user's module under any wrapper.

Used by the GPT engine (`ddp`, `zero1`) and by the LeNet data-parallel modes, so nothing here knows
about either model.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def wrap_ddp(model: nn.Module, device: torch.device, process_group=None, **ddp_kwargs) -> DDP:
    """Move `model` to `device` and wrap it in DDP (one device per rank).

    DDP broadcasts rank 0's parameters at construction, so ranks start identical even if their
    initializations differed. Gradients are all-reduced (averaged) in buckets during backward.
    """
    device = torch.device(device)
    model = model.to(device)
    device_ids = (
        [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else None
    )
    return DDP(model, device_ids=device_ids, process_group=process_group, **ddp_kwargs)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under any stack of torch.compile / DDP / nn.DataParallel wrappers (state-dict
    keys without the 'module.' / '_orig_mod.' prefixes). FSDP2 shards in place: nothing to unwrap."""
    while True:
        if hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        elif isinstance(model, (DDP, nn.DataParallel)):
            model = model.module
        else:
            return model


def gradient_sync(model: nn.Module, enabled: bool):
    """Context for one backward: with `enabled` False, gradients accumulate locally without any
    communication (DDP `no_sync`; FSDP2 `set_requires_gradient_sync(False)`), so gradient
    accumulation communicates once per optimizer step instead of once per micro-step."""
    if enabled:
        return nullcontext()
    if isinstance(model, DDP):
        return model.no_sync()
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        return _fsdp_no_sync(model)
    return nullcontext()  # single process: nothing to skip


@contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
