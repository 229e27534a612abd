"""Tensor parallelism with DTensor `parallelize_module` (Megatron-style attention and MLP split).

Per block: q/k/v projections column-wise (each rank computes n_head/tp heads; the attention core
needs no communication), o_proj row-wise (a partial sum, all-reduced); MLP fc column-wise, proj
row-wise. So each block costs two all-reduces forward and two backward. Embeddings, LayerNorms and
the (tied) LM head stay replicated as plain tensors: every TP rank computes the same values and,
because the input gradient of a column-wise layer is all-reduced, the same gradients.
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trainlab.errors import ConfigError

BLOCK_PLAN = {
    "attn.q_proj": ColwiseParallel,
    "attn.k_proj": ColwiseParallel,
    "attn.v_proj": ColwiseParallel,
    "attn.o_proj": RowwiseParallel,
    "mlp.fc": ColwiseParallel,
    "mlp.proj": RowwiseParallel,
}


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Split every block of our GPT across `tp_mesh` (1-D) in place. The model must already be on
    the mesh's device type. The head count must be divisible by the TP degree."""
    tp = tp_mesh.size()
    n_head = model.config.n_head
    if n_head % tp:
        raise ConfigError(f"--tp {tp}: must divide the number of heads ({n_head})")
    for block in model.h.values():
        parallelize_module(block, tp_mesh, {name: style() for name, style in BLOCK_PLAN.items()})
    return model
