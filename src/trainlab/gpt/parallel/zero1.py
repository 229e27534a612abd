"""ZeRO stage 1: DDP for gradients + `ZeroRedundancyOptimizer` for optimizer states.

Each rank keeps the AdamW moments of roughly 1/world of the parameters, updates only those
parameters, and broadcasts them to the others after the step. Gradients are still all-reduced in
full by DDP (that is what distinguishes stage 1 from stages 2/3).
"""

from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer


def build_zero1_optimizer(
    params, *, optimizer_class=torch.optim.AdamW, fused: bool = False, process_group=None, **optimizer_kwargs
) -> ZeroRedundancyOptimizer:
    """`optimizer_class` (AdamW by default) whose states are partitioned across the data-parallel ranks."""
    if fused:
        optimizer_kwargs["fused"] = True
    return ZeroRedundancyOptimizer(
        list(params),
        optimizer_class=optimizer_class,
        process_group=process_group,
        parameters_as_bucket_view=False,
        **optimizer_kwargs,
    )
