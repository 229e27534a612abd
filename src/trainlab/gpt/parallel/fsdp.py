"""ZeRO stages 2 and 3 and CPU offload with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Every transformer block is its own FSDP group (one all-gather / reduce-scatter per block, which
lets communication overlap compute and bounds the unsharded memory to about one block), and the
root groups what is left: embeddings (tied with the LM head), final LayerNorm.

- zero3: `reshard_after_forward=True` — parameters are freed after each block's forward and
  all-gathered again in backward (parameters, gradients and optimizer states sharded).
- zero2: `reshard_after_forward=False` — unsharded parameters stay from forward to backward (no
  second all-gather); gradients and optimizer states sharded. FSDP2 still reshards after backward,
  so between steps parameters are sharded too: this is PyTorch's SHARD_GRAD_OP, the usual stand-in
  for ZeRO-2.
- offload: `CPUOffloadPolicy` — sharded parameters, gradients and optimizer states live in CPU
  memory; the optimizer step runs on the CPU, and each block is copied to the GPU for compute.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

from trainlab.gpt.model import transformer_blocks


def apply_fsdp(
    model: nn.Module,
    device: torch.device,
    *,
    reshard_after_forward: bool,
    offload: bool = False,
    mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Shard `model` in place, block by block then the root; returns the (same) FSDPModule."""
    device = torch.device(device)
    if mesh is None:
        mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),), mesh_dim_names=("dp",))
    # pin_memory makes the host↔GPU copies asynchronous; there is nothing to pin for on a CPU run.
    policy = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, offload_policy=policy)
    # Root: None lets FSDP keep it unsharded after forward, since backward needs the LM head first.
    fully_shard(model, mesh=mesh, reshard_after_forward=None if reshard_after_forward else False, offload_policy=policy)
    return model
