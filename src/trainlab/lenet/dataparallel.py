"""`nn.DataParallel`: one process drives every visible GPU.

Each step it scatters the batch over the GPUs, *replicates the model from GPU 0* (a copy of all
weights every forward), runs the replicas in Python threads (GIL-bound), gathers the outputs on
GPU 0 and reduces gradients there. That per-step replication and the single-process Python
bottleneck are why it is often slower than one GPU for a small model like LeNet-5 — and why
PyTorch recommends DDP instead. It is here to be measured, not to be used.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from trainlab.errors import ConfigError, HardwareError


def check_data_parallel(device: str, global_batch: int) -> int:
    """The number of GPUs DataParallel would use; a clear error when it cannot be meaningful."""
    if device not in ("auto", "cuda") and not str(device).startswith("cuda"):
        raise ConfigError(f"--parallel dp with --device {device}: nn.DataParallel splits batches over CUDA GPUs; "
                          "use --device cuda (or --parallel ddp/allreduce on the CPU)")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        raise HardwareError(f"--parallel dp needs at least 2 CUDA GPUs, found {n}: nn.DataParallel on one device "
                            "is single-device training with extra copies (use --parallel none)")
    # A batch the GPUs do not divide is fine: scatter gives the last GPU a smaller chunk, and the loss is
    # computed on the outputs gathered on GPU 0, so uneven chunks weigh every image alike.
    if global_batch < n:
        raise ConfigError(f"--batch-size {global_batch} is smaller than the {n} GPUs nn.DataParallel splits it over")
    return n


def wrap_data_parallel(model: nn.Module) -> nn.DataParallel:
    """Wrap a model that lives on cuda:0 in DataParallel over all visible GPUs (call check_data_parallel first)."""
    return nn.DataParallel(model, device_ids=list(range(torch.cuda.device_count())), output_device=0)
