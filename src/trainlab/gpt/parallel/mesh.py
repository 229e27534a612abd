"""One device mesh for data × pipeline × tensor parallelism (picotron's dp × pp × tp grid).

Rank r sits at (dp, pp, tp) = divmod-wise coordinates of r in a [dp, pp, tp] grid, tp fastest: the
ranks of one tensor-parallel group are neighbours (on a GPU node: the fastest links), a pipeline
runs across them, and the data-parallel replicas are the outermost copies of the whole model-parallel
grid. Only the dimensions of size > 1 are built (`init_device_mesh` makes one process group per
dimension and slice); a missing dimension is None.

Data parallelism on this mesh, by strategy:
- zero2/zero3: FSDP2 `fully_shard(mesh=dp)` on the tensor-parallel (DTensor) blocks or the pipeline
  stage: parameters become DTensors sharded over dp (and tp), torch's 2-D FSDP+TP; the pipeline
  schedule drives FSDP's per-micro-batch gradient sync itself.
- ddp/zero1: torch's DistributedDataParallel takes no DTensor parameters (torchtitan refuses DDP with
  any other dimension for that reason), so the gradients of the step are averaged over the dp group
  just before the optimizer steps (`average_gradients_before_step`): one flat all-reduce per
  optimizer step, after every micro-batch's backward, which is what DDP's no_sync + last-step sync
  amounts to, without DDP's overlap of communication with backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from trainlab.gpt.strategy import Degrees


@dataclass
class ParallelMesh:
    """The mesh of one rank: its sub-meshes (None where the degree is 1) and its coordinates."""

    degrees: Degrees
    mesh: DeviceMesh
    dp: DeviceMesh | None
    pp: DeviceMesh | None
    tp: DeviceMesh | None

    @property
    def dp_rank(self) -> int:
        return self.dp.get_local_rank() if self.dp is not None else 0

    @property
    def stage(self) -> int:
        return self.pp.get_local_rank() if self.pp is not None else 0

    @property
    def dp_group(self):
        return self.dp.get_group() if self.dp is not None else None

    def tied_pairs(self) -> list[tuple[int, int]]:
        """(first stage, last stage) global ranks for every (dp, tp) coordinate: the ranks that hold
        the two copies of the tied embedding and must sum its gradient (`pipeline.tied_weight_group`)."""
        d = self.degrees
        grid = self.mesh.mesh.reshape(d.dp, d.pp, d.tp).tolist()
        return [(grid[i][0][t], grid[i][-1][t]) for i in range(d.dp) for t in range(d.tp)]


def build_mesh(device_type: str, degrees: Degrees) -> ParallelMesh:
    """The [dp, pp, tp] mesh over the whole world (collective: every rank calls it)."""
    dims = [(name, size) for name, size in (("dp", degrees.dp), ("pp", degrees.pp), ("tp", degrees.tp)) if size > 1]
    names = tuple(n for n, _ in dims)
    mesh = init_device_mesh(device_type, tuple(s for _, s in dims), mesh_dim_names=names)
    sub = {n: (mesh if len(names) == 1 else mesh[n]) for n in names}
    return ParallelMesh(degrees, mesh, sub.get("dp"), sub.get("pp"), sub.get("tp"))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def average_gradients(params: list[torch.Tensor], group, size: int) -> None:
    """Replace every gradient by its mean over the `size` ranks of `group`: one all-reduce of one flat
    buffer (gloo has no AVG: a SUM, then a division). A tensor-parallel DTensor gradient is averaged
    as its local shard: the replicas of one tp coordinate hold the same shard of it."""
    grads = [_local(p.grad) for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    for g, mean in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(mean.view_as(g))


def average_gradients_before_step(optimizer: torch.optim.Optimizer, params, group, size: int) -> None:
    """ddp/zero1 on a multi-dimensional mesh: the optimizer's step first averages the gradients over
    the data-parallel group (a step pre-hook, so every step path — the eager step, the pipeline's,
    fp32 or bf16 — syncs exactly once per optimizer step)."""
    params = list(params)
    optimizer.register_step_pre_hook(lambda *_: average_gradients(params, group, size))
