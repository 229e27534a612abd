"""Pipeline parallelism with `torch.distributed.pipelining` (GPipe and 1F1B schedules).

The full, deterministically initialized GPT is cut by hand: stage s keeps a contiguous range of
blocks (`model.h` is a ModuleDict, so surviving parameters keep their full-model names); the first
stage keeps the embeddings, the last the final LayerNorm and the LM head.

Tied embedding. GPT-2 uses one matrix as input embedding (first stage) and LM head (last stage).
After the split each of the two stages holds its own copy, initialized identically, and each
receives only its part of the gradient. After every backward we all-reduce (sum) that gradient
between the two stages (a 2-rank process group per data- and tensor-parallel coordinate), so both copies get the
full-model gradient and identical AdamW updates: the result equals single-process training.

The schedule's loss is `lm_loss` on each micro-batch; with `scale_grads=True` the schedule divides
gradients by the number of micro-batches, so they are those of the mean loss over the batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor

from trainlab.errors import ConfigError

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_layer_ranges(n_layer: int, n_stages: int) -> list[range]:
    """Contiguous block ranges per stage, as even as possible (earlier stages take the remainder;
    the last stage also runs the LM head, the largest single matmul)."""
    if n_stages > n_layer:
        raise ConfigError(f"--pp {n_stages}: more pipeline stages than layers ({n_layer})")
    base, extra = divmod(n_layer, n_stages)
    ranges, start = [], 0
    for s in range(n_stages):
        size = base + (1 if s < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def split_stage(model: nn.Module, stage: int, n_stages: int) -> nn.Module:
    """Delete from the full `model` (in place) everything stage `stage` does not run."""
    keep = stage_layer_ranges(len(model.h), n_stages)[stage]
    for key in list(model.h.keys()):
        if int(key) not in keep:
            del model.h[key]
    if stage != 0:
        model.wte = None
        model.wpe = None
    if stage != n_stages - 1:
        model.ln_f = None
        model.lm_head = None
    return model


def tied_weight(model: nn.Module) -> torch.Tensor | None:
    """The copy of the tied embedding this stage holds (wte on the first stage, lm_head on the last)."""
    if model.wte is not None:
        return model.wte.weight
    if model.lm_head is not None:
        return model.lm_head.weight
    return None


def tied_weight_group(pairs: list[tuple[int, int]]):
    """One 2-rank group {first stage, last stage} per (data-parallel, tensor-parallel) coordinate.

    `pairs` lists the global ranks of those two stages (`mesh.ParallelMesh.tied_pairs`). Every rank
    must call this (new_group is collective); returns the group this rank belongs to, or None.
    """
    me = dist.get_rank()
    mine = None
    for first, last in pairs:
        group = dist.new_group([first, last])
        if me in (first, last):
            mine = group
    return mine


class PipelineRunner:
    """Runs one training step of this rank's stage and returns the batch's mean loss on every rank."""

    def __init__(
        self,
        stage_module: nn.Module,
        stage_index: int,
        n_stages: int,
        device: torch.device,
        pp_mesh: DeviceMesh,
        tied_pairs: list[tuple[int, int]],
        n_microbatches: int,
        schedule: str,
        loss_fn,
        autocast_factory,
    ):
        if schedule not in SCHEDULES:
            raise ConfigError(f"--pp-schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
        self.module = stage_module
        self.stage_index = stage_index
        self.n_stages = n_stages
        self.is_first = stage_index == 0
        self.is_last = stage_index == n_stages - 1
        self.device = torch.device(device)
        self.group = pp_mesh.get_group()
        self.n_microbatches = n_microbatches
        self._autocast = autocast_factory
        self.stage = PipelineStage(stage_module, stage_index, n_stages, self.device, group=self.group)
        self.schedule = SCHEDULES[schedule](
            self.stage, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True
        )
        self.tied_group = tied_weight_group(tied_pairs)
        self.tied = tied_weight(stage_module) if (self.is_first or self.is_last) else None

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Forward + backward of all micro-batches (gradients left in .grad); returns the mean loss."""
        losses: list[torch.Tensor] = []
        with self._autocast():
            if self.is_first and self.is_last:  # unreachable: validate_strategy asks for >= 2 stages
                raise ConfigError("pp needs at least 2 stages")
            if self.is_first:
                self.schedule.step(tokens)
            elif self.is_last:
                self.schedule.step(target=tokens, losses=losses)
            else:
                self.schedule.step()
        if self.tied is not None and self.tied_group is not None:
            grad = self.tied.grad if self.tied.grad is not None else torch.zeros_like(self.tied)
            # under FSDP (zero2/3 × pp) the gradient is this rank's dp shard: both stages of one dp
            # coordinate hold the same shard of the same-shaped copy, so the shards sum alike
            dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=self.tied_group)
            self.tied.grad = grad
        loss = (
            torch.stack([l.detach().float() for l in losses]).mean()
            if self.is_last
            else torch.zeros((), device=self.device)
        )
        # Every rank reports the same number: the last stage shares its loss with its pipeline.
        dist.broadcast(loss, group=self.group, group_src=self.n_stages - 1)
        return loss
