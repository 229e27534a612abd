"""Ring all-reduce by hand: point-to-point send/recv only, overlapped with the backward pass.

`--parallel allreduce` (lenet/allreduce.py) buckets gradients but lets `dist.all_reduce` do the
reduction. Here the reduction itself is ours, the algorithm NCCL and Horovod use for large messages
(Patarasuk & Yuan 2009). The W ranks form a ring (rank r sends to r+1, receives from r−1) and a flat
buffer of S bytes is cut into W chunks:

1. reduce-scatter, W−1 steps: at step s rank r sends chunk (r−s) mod W to the right, receives chunk
   (r−s−1) mod W from the left and adds it to its own copy. Every chunk travels once around the ring,
   picking up one rank's contribution per hop; afterwards rank r holds the full sum of chunk (r+1) mod W.
2. all-gather, W−1 steps: each finished chunk travels once more around the ring, copied, not added.

Each rank sends 2(W−1) chunks of S/W bytes: 2(W−1)/W·S in all, which is the lower bound for any
all-reduce in which every rank sends the same amount — so, given a link of B bytes/s, no all-reduce can
finish faster than 2(W−1)/W·S/B, and the ring's time does not grow with W. `dp compare` reports the
"bus bandwidth" algbw·2(W−1)/W (algbw = S/time, nccl-tests' definition) next to a measured link bandwidth:
their ratio is how close this implementation gets to that bound (on small messages per-step latency,
2(W−1) hops, dominates instead).

Overlap: gradients are grouped into buckets in the order backward produces them (last layer first).
A `post_accumulate_grad` hook counts each bucket's gradients; when a bucket is complete, a
communication thread runs its ring while backward computes earlier layers. The thread reduces buckets
in a fixed order (bucket 0, 1, …), never in arrival order, so every rank issues the same sends and
receives in the same sequence — a rank that reduced buckets in another order would deadlock or add the
wrong chunks. `sync()` (after backward, before the optimizer step) waits for the last bucket.

Uneven shards: every rank's loss is pre-scaled by W·n_r/N (`DeviceLoader.shard_weights`), so dividing
the sum by W — as DDP does — yields the gradient of the global batch's mean loss.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from trainlab.device import synchronize
from trainlab.lenet.allreduce import make_buckets

# Small enough that LeNet-5's 247 KB of gradients form several buckets (output layers, fc1, convolutions),
# so the first buckets travel while backward still computes the convolutions.
RING_BUCKET_BYTES = 64 << 10


def _peer(group, rank_in_group: int) -> int:
    """Global rank of a group member (p2p calls take global ranks)."""
    return rank_in_group if group is None else dist.get_global_rank(group, rank_in_group)


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, group) -> int:
    """Send to the right neighbour and receive from the left one, both posted before either waits
    (with NCCL they are one group call; sequential blocking send-then-recv would deadlock the ring).
    An empty chunk is neither sent nor expected: the link r→r+1 carries the same chunk index on both
    sides, so sender and receiver skip it together. Returns the bytes sent."""
    ops = []
    if send.numel():
        ops.append(dist.P2POp(dist.isend, send, right, group))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, left, group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return send.numel() * send.element_size()


def ring_allreduce_(flat: torch.Tensor, group=None) -> int:
    """Sum the contiguous 1-D tensor `flat` over all ranks of `group`, in place, with the ring
    algorithm. Returns the number of bytes this rank sent (2(W−1)/W of `flat`'s bytes, up to chunk rounding)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if world == 1:
        return 0
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ValueError("ring_allreduce_ takes a contiguous 1-D tensor")
    right, left = _peer(group, (rank + 1) % world), _peer(group, (rank - 1) % world)
    chunks = list(flat.tensor_split(world))  # contiguous views; sizes differ by at most one element
    scratch = torch.empty_like(chunks[0])  # the largest chunk (tensor_split puts the larger ones first)
    sent = 0
    for step in range(world - 1):  # reduce-scatter
        out, into = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
        incoming = scratch[: into.numel()]
        sent += _exchange(out, incoming, right, left, group)
        into.add_(incoming)
    for step in range(world - 1):  # all-gather: received chunks land in place
        out, into = chunks[(rank + 1 - step) % world], chunks[(rank - step) % world]
        sent += _exchange(out, into, right, left, group)
    return sent


def median_seconds(fn, device: torch.device, group=None, repeats: int = 20) -> float:
    """Median wall time of `fn()` over `repeats` calls after one warm-up call, every rank starting
    together (barrier) so that the time is the operation's own, not a wait for a late peer."""
    times = []
    for i in range(repeats + 1):
        dist.barrier(group=group)
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        if i:  # the first call sets up connections and buffers
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def measure_link_bandwidth(nbytes: int, device: torch.device, group=None, repeats: int = 20) -> float:
    """Bytes/s of one ring hop: every rank sends `nbytes` to its right neighbour while receiving as
    much from its left one (the pattern of each ring step). This is the B of the 2(W−1)/W·S/B bound."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    right, left = _peer(group, (rank + 1) % world), _peer(group, (rank - 1) % world)
    send = torch.ones(max(1, nbytes // 4), device=device)
    recv = torch.empty_like(send)
    return send.numel() * 4 / median_seconds(lambda: _exchange(send, recv, right, left, group), device, group, repeats)


def measure_allreduce_seconds(
    algorithm: str, nbytes: int, device: torch.device, group=None, repeats: int = 20
) -> float:
    """Median time of one all-reduce of `nbytes` (float32) by `algorithm` — "ring" (ours) or "builtin"
    (`dist.all_reduce`, what DDP and `--parallel allreduce` call) — with all ranks starting together."""
    flat = torch.ones(max(1, nbytes // 4), device=device)
    if algorithm == "ring":
        return median_seconds(lambda: ring_allreduce_(flat, group), device, group, repeats)
    return median_seconds(lambda: dist.all_reduce(flat, group=group), device, group, repeats)


class RingAllReduce:
    """Average a model's gradients over ranks with `ring_allreduce_`, one ring per bucket, launched by
    backward hooks on a communication thread (`overlap=True`) or all after backward (`overlap=False`).

    Usage per step: `loss.backward()` (hooks launch the buckets), then `sync()` (waits, then every
    `p.grad` holds the average), then `optimizer.step()`. `on_comm(seconds)` receives the thread's busy
    time per step (for `dp compare`); `bytes_sent` the bytes this rank sent in the last step.
    """

    def __init__(
        self,
        model: nn.Module,
        world_size: int,
        bucket_bytes: int = RING_BUCKET_BYTES,
        group=None,
        overlap: bool = True,
        on_comm=None,
    ):
        self.world_size, self.group, self.overlap, self.on_comm = world_size, group, overlap, on_comm
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = make_buckets(list(reversed(params)), bucket_bytes)  # the order backward produces them
        self.grad_bytes = sum(p.numel() * p.element_size() for p in params)
        self.bytes_sent = 0
        self._flats = [
            torch.empty(sum(p.numel() for p in b), dtype=b[0].dtype, device=b[0].device) for b in self.buckets
        ]
        self._device = params[0].device
        self._stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        self._events: list = [None] * len(self.buckets)
        self._bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self._remaining = [len(b) for b in self.buckets]
        self._launched = [False] * len(self.buckets)
        self._ready = [threading.Event() for _ in self.buckets]
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._closing = False
        self._hooks = []
        self._thread = None
        if overlap and world_size > 1:
            self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in params]
            self._thread = threading.Thread(target=self._serve, name="ring-allreduce", daemon=True)
            self._thread.start()

    # ---- backward side (autograd thread) --------------------------------------------------------
    def _grad_ready(self, p: torch.Tensor) -> None:
        i = self._bucket_of[p]
        self._remaining[i] -= 1
        if self._remaining[i] == 0:
            self._launch(i)

    def _launch(self, i: int) -> None:
        self._remaining[i] = len(self.buckets[i])
        self._launched[i] = True
        if self._stream is not None:  # the comm stream must not read the gradients before backward wrote them
            self._events[i] = torch.cuda.Event()
            self._events[i].record()
        self._ready[i].set()

    # ---- communication thread ------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            busy, sent = 0.0, 0
            for i in range(len(self.buckets)):  # fixed order on every rank
                self._ready[i].wait()
                if self._closing:
                    return
                t0 = time.perf_counter()
                try:
                    if self._error is None:
                        sent += self._reduce_bucket(i)
                except BaseException as e:  # re-raised in sync() on the training thread
                    self._error = e
                busy += time.perf_counter() - t0
                self._ready[i].clear()
            self.bytes_sent = sent
            if self.on_comm is not None:
                self.on_comm(busy)
            self._done.set()

    def _reduce_bucket(self, i: int) -> int:
        if self._stream is None:
            return self._ring_bucket(i)
        with torch.cuda.stream(self._stream):
            if self._events[i] is not None:
                self._stream.wait_event(self._events[i])
            sent = self._ring_bucket(i)
            if self.on_comm is not None:
                self._stream.synchronize()  # only when timing: the busy time must include the GPU work
            return sent

    def _ring_bucket(self, i: int) -> int:
        bucket, flat = self.buckets[i], self._flats[i]
        offset = 0
        for p in bucket:  # a parameter without a gradient on this rank contributes zeros
            n = p.numel()
            if p.grad is None:
                flat[offset : offset + n].zero_()
            else:
                flat[offset : offset + n].copy_(p.grad.reshape(-1))
            offset += n
        sent = ring_allreduce_(flat, self.group)
        flat.div_(self.world_size)
        offset = 0
        for p in bucket:
            view = flat[offset : offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = view.clone()
            else:
                p.grad.copy_(view)
            offset += p.numel()
        return sent

    # ---- training thread -----------------------------------------------------------------------
    def sync(self) -> None:
        """After backward: every `p.grad` is the average over ranks when this returns."""
        if self.world_size == 1:
            return
        if not self.overlap:
            t0 = time.perf_counter()
            self.bytes_sent = sum(self._ring_bucket(i) for i in range(len(self.buckets)))
            if self.on_comm is not None:
                synchronize(self._device)
                self.on_comm(time.perf_counter() - t0)
            return
        for i, launched in enumerate(self._launched):
            if not launched:  # a bucket with a parameter that got no gradient this step: send zeros for it
                self._launch(i)
        self._done.wait()
        self._done.clear()
        self._launched = [False] * len(self.buckets)
        self._remaining = [len(b) for b in self.buckets]
        if self._stream is not None:
            torch.cuda.current_stream(self._device).wait_stream(self._stream)
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._thread is not None:
            self._closing = True
            for e in self._ready:
                e.set()
            self._thread.join(timeout=5)
            self._thread = None
