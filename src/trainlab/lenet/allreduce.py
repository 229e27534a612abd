"""Data parallelism by hand (the d2l "from scratch" method) on `torch.distributed`, no DDP.

Every rank holds a full replica, computes gradients on its shard of the global batch, then
1. flattens the gradients into a few contiguous buckets (one collective per bucket instead of one
   per parameter: each collective has a fixed latency, so fewer, larger messages are cheaper),
2. `all_reduce`s each bucket with SUM (launched asynchronously, all buckets in flight at once),
3. divides by the world size — the mean of the per-rank mean losses' gradients is the gradient of
   the global batch's mean loss, because every rank's shard has the same size,
4. copies the averaged values back into `p.grad`, and every rank steps the same optimizer.
Replicas start identical (`broadcast_parameters`) and receive identical gradients, so they stay
identical without ever exchanging weights again.

Unlike DDP, nothing overlaps with the backward pass: the whole communication time is exposed
after backward, which is what the comparison in `trainlab dp compare` shows.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

DEFAULT_BUCKET_BYTES = 1 << 20  # 1 MiB: LeNet-5's 247 KB of gradients fit in one bucket


def make_buckets(params: list[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """Group parameters, in order, into lists whose gradients total at most `bucket_bytes` (a larger
    parameter gets a bucket of its own). Buckets never mix dtypes or devices (one flat tensor each)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        last = buckets[-1] if buckets else None
        if last is None or size + nbytes > bucket_bytes or last[0].dtype != p.dtype or last[0].device != p.device:
            buckets.append([p])
            size = nbytes
        else:
            last.append(p)
            size += nbytes
    return buckets


def allreduce_gradients(
    buckets: list[list[torch.Tensor]], world_size: int, group=None, host_staged: bool = False
) -> None:
    """Average `p.grad` over all ranks, one SUM all-reduce per bucket, in place. `host_staged` (a mixed
    CPU + GPU world on gloo, `--rank-devices`): each bucket goes through host memory.

    A parameter without a gradient on this rank contributes zeros (other ranks may have one), so
    every rank issues the same collectives in the same order — a mismatch would deadlock.
    """
    if world_size == 1:
        return
    flats, works = [], []
    for bucket in buckets:
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])
        if host_staged:
            flat = flat.cpu()  # a GPU rank's bucket crosses to the host once, and comes back once below
        works.append(dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True))
        flats.append(flat)
    for bucket, flat, work in zip(buckets, flats, works):
        work.wait()
        flat.div_(world_size)
        offset = 0
        for p in bucket:
            n = p.numel()
            view = flat[offset : offset + n].view_as(p).to(p.device)
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)
            offset += n


def broadcast_parameters(model: nn.Module, src: int = 0, group=None, host_staged: bool = False) -> None:
    """Make every replica equal to rank `src`'s (parameters and buffers), as DDP does at construction."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if host_staged and t.device.type != "cpu":
                h = t.data.cpu()
                dist.broadcast(h, src=src, group=group)
                t.data.copy_(h)
            else:
                dist.broadcast(t.data, src=src, group=group)


class HandAllReduce:
    """The per-model state of the hand-written method: its buckets, built once."""

    def __init__(
        self,
        model: nn.Module,
        world_size: int,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        group=None,
        host_staged: bool = False,
    ):
        self.world_size, self.group, self.host_staged = world_size, group, host_staged
        self.buckets = make_buckets([p for p in model.parameters() if p.requires_grad], bucket_bytes)

    def sync(self) -> None:
        allreduce_gradients(self.buckets, self.world_size, self.group, self.host_staged)
