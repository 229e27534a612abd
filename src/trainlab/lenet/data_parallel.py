"""How the LeNet-5 trainer runs data-parallel: one object the training loop asks a few questions.

- which rank am I and where do I compute (`rank`, `world_size`, `device`, `is_main`)
- `wrap(model)`: DataParallel / DDP wrapper, or the model itself
- `after_backward(model)`: the hand-written all-reduce / ring (no-op for the other modes)
- `shard_weights(batches)`: per-step loss weights that make uneven shards exact
- `step_means(...)`, `sum_(t)`, `gather(t)`: loss/accuracy over ranks (logging), sharded evaluation
- `timer`: where each step's time goes (data / compute / communication), when asked for
- `raise_if_peer_failure(exc)`: turn a failed collective into one clear line

Modes: none (single process), dp (nn.DataParallel, below), ddp (DistributedDataParallel), allreduce
(hand-written bucketed all-reduce, lenet/allreduce.py), ring (ring all-reduce from send/recv,
overlapped with backward, lenet/ring.py). The loop stays the same for all of them.

`nn.DataParallel` (dp): one process drives every visible GPU. Each step it scatters the batch over the
GPUs, *replicates the model from GPU 0* (a copy of all weights every forward), runs the replicas in
Python threads (GIL-bound), gathers the outputs on GPU 0 and reduces gradients there. That per-step
replication and the single-process Python bottleneck are why it is often slower than one GPU for a
small model like LeNet-5 — and why PyTorch recommends DDP instead. It is here to be measured, not to
be used.
Multi-process modes run one process per device under torchrun (or `spawn_for_test`); the device loader
splits every global batch across ranks (shards differ by at most one row when the world size does not
divide the batch), so every mode sees the same global batches. Each rank's loss is weighted by
W·n_rank/n_global, which makes the averaged gradient exactly the global batch's. The test set is
sharded the same way and the results gathered (`evaluate(..., par)`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from trainlab.data.loader import shard_bounds
from trainlab.device import resolve_device, synchronize
from trainlab.distributed.failure import raise_if_peer_failure
from trainlab.distributed.launch import (
    DEFAULT_TIMEOUT_S,
    DistInfo,
    dist_timeout_s,
    ensure_process_group,
    init_distributed,
    keep_alive,
    release_group,
)
from trainlab.distributed.wrappers import wrap_ddp
from trainlab.errors import ConfigError, HardwareError
from trainlab.hardware import check_process_count
from trainlab.lenet.allreduce import HandAllReduce, broadcast_parameters
from trainlab.lenet.ring import RingAllReduce, measure_allreduce_seconds, measure_link_bandwidth
from trainlab.stats import summarize

MODES = ("none", "dp", "ddp", "allreduce", "ring")
MULTI_PROCESS_MODES = ("ddp", "allreduce", "ring")


class StepTimer:
    """Per-step data / compute / communication time, synchronized (on CUDA) at each boundary.

    Disabled (the default) it only forwards batches: synchronizing every step would stall an
    asynchronous device, so it is switched on for measurements (`trainlab dp compare`), not for training.
    - data: fetching the batch and moving it to the device
    - communication: the hand-written all-reduce (exposed: nothing else runs meanwhile), or, under
      DDP, the bucket all-reduces measured by a comm hook from launch to completion, or, for the ring,
      the communication thread's busy time — these overlap the backward pass, so for DDP and the
      ring they are *part of* compute, not additional to it
    - compute: the rest of the step (forward, backward, optimizer), exposed communication excluded
    """

    def __init__(self, device: torch.device, enabled: bool = False):
        self.device, self.enabled = device, enabled
        self.data: list[float] = []
        self.compute: list[float] = []
        self.comm: list[float] = []
        self.comm_overlapped = False
        self.grad_bytes: int | None = None  # bytes all-reduced per step
        self.link_bytes_per_s: float | None = None  # measured ring-hop bandwidth (the bound's B)
        self.allreduce_s: float | None = None  # one all-reduce of grad_bytes, all ranks starting together
        self.bytes_sent = None  # callable: bytes this rank sent last step (ring)
        self._sent: list[int] = []
        self._pending_comm = 0.0
        self._t = 0.0

    def batches(self, iterable, prepare):
        """Yield `prepare(batch)` for each batch, timing fetch + prepare as data time."""
        if not self.enabled:
            for batch in iterable:
                yield prepare(batch)
            return
        it = iter(iterable)
        while True:
            synchronize(self.device)
            t0 = time.perf_counter()
            try:
                batch = prepare(next(it))
            except StopIteration:
                return
            synchronize(self.device)
            self._t = time.perf_counter()
            self.data.append(self._t - t0)
            self._pending_comm = 0.0
            yield batch

    def add_comm(self, seconds: float) -> None:
        self._pending_comm += seconds

    def communication(self):
        """Context that times an exposed (blocking) communication phase."""
        return _TimedComm(self) if self.enabled else _NULL

    def step_done(self) -> None:
        if not self.enabled:
            return
        synchronize(self.device)
        step = time.perf_counter() - self._t
        self.comm.append(self._pending_comm)
        self.compute.append(step if self.comm_overlapped else step - self._pending_comm)
        if self.bytes_sent is not None:
            self._sent.append(self.bytes_sent())

    def summary(self) -> dict | None:
        """Milliseconds per step: median with spread for each phase (None when disabled)."""
        if not self.enabled or not self.data:
            return None
        ms = lambda xs: summarize([x * 1e3 for x in xs])  # noqa: E731
        return {
            "steps": len(self.data),
            "data_ms": ms(self.data),
            "compute_ms": ms(self.compute),
            "comm_ms": ms(self.comm),
            "comm_overlapped": self.comm_overlapped,
            "grad_bytes": self.grad_bytes,
            "link_bytes_per_s": self.link_bytes_per_s,
            "allreduce_ms": self.allreduce_s * 1e3 if self.allreduce_s else None,
            "bytes_sent_per_step": max(self._sent) if self._sent else None,
        }


class _TimedComm:
    def __init__(self, timer: StepTimer):
        self.timer = timer

    def __enter__(self):
        synchronize(self.timer.device)
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        synchronize(self.timer.device)
        self.timer.add_comm(time.perf_counter() - self.t0)


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NULL = _Null()


@dataclass
class DataParallelContext:
    mode: str = "none"
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    timeout_s: float = DEFAULT_TIMEOUT_S
    owns_group: bool = False  # this context created the process group, so it destroys it
    host_staged: bool = False  # a mixed CPU + GPU world on gloo: every collective goes through host memory
    timer: StepTimer | None = None
    _reducer: object = field(default=None, repr=False)

    def __post_init__(self):
        if self.timer is None:
            self.timer = StepTimer(self.device, enabled=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.mode == "dp":
            return wrap_data_parallel(model)
        if self.timer.enabled and self.multi_process:  # for the bandwidth columns of `dp compare`
            self.timer.grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
            self.timer.link_bytes_per_s = measure_link_bandwidth(self.timer.grad_bytes, self.device)
            self.timer.allreduce_s = measure_allreduce_seconds(
                "ring" if self.mode == "ring" else "builtin", self.timer.grad_bytes, self.device
            )
        if self.mode == "ddp":
            ddp = wrap_ddp(model, self.device)  # broadcasts rank 0's weights
            keep_alive(ddp)  # its destructor can block on gloo once a peer has gone (launch.keep_alive)
            if self.timer.enabled:
                self.timer.comm_overlapped = True
                ddp.register_comm_hook(self.timer, _timed_allreduce_hook)
            return ddp
        if self.mode in ("allreduce", "ring") and self.world_size > 1:
            broadcast_parameters(model, host_staged=self.host_staged)  # replicas start identical, as under DDP
            if self.mode == "allreduce":
                self._reducer = HandAllReduce(model, self.world_size, host_staged=self.host_staged)
            else:
                self.timer.comm_overlapped = True
                self._reducer = RingAllReduce(
                    model, self.world_size, on_comm=self.timer.add_comm if self.timer.enabled else None
                )
                self.timer.bytes_sent = lambda: self._reducer.bytes_sent
        return model

    def after_backward(self, model: nn.Module) -> None:
        """Average gradients over ranks (hand-written modes; DDP does it inside backward)."""
        if isinstance(self._reducer, RingAllReduce):
            self._reducer.sync()  # waits for the buckets the backward hooks launched (timed on the comm thread)
        elif self._reducer is not None:
            with self.timer.communication():
                self._reducer.sync()

    @property
    def multi_process(self) -> bool:
        return self.world_size > 1 and self.mode in MULTI_PROCESS_MODES

    def rank_batches(self, global_batch: int, shares: tuple[float, ...] | None = None) -> str | None:
        """ "85, 85, 86": the rows each rank gets of a full global batch (None in a single process)."""
        if not self.multi_process:
            return None
        return ", ".join(
            str(hi - lo)
            for lo, hi in (shard_bounds(global_batch, r, self.world_size, 0, shares) for r in range(self.world_size))
        )

    def shard_weights(self, batches) -> list[float] | None:
        """Per step, the factor W·n_rank/n_global for this rank's mean loss (None: nothing to weight)."""
        if not self.multi_process:
            return None
        weights = batches.shard_weights()
        return None if all(w == 1.0 for w in weights) else weights

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over ranks, in place (a no-op in a single process)."""
        if self.multi_process:
            with on_host(t, self.host_staged) as h:
                dist.all_reduce(h, op=dist.ReduceOp.SUM)
        return t

    def step_means(
        self, losses: torch.Tensor, correct: torch.Tensor, sizes: list[int]
    ) -> tuple[list[float], list[float], float]:
        """Per step, the global batch's mean loss and accuracy (%), and the epoch's accuracy (%), from
        each rank's mean losses, correct counts and shard sizes; one collective and one device→host
        copy for the whole epoch."""
        n = torch.tensor(sizes, dtype=torch.float64, device=losses.device)
        if self.multi_process:
            stats = self.sum_(torch.stack([losses.double() * n, correct.double(), n])).cpu()
            loss = stats[0] / stats[2]
        else:
            stats = torch.stack([losses.double(), correct.double(), n]).cpu()
            loss = stats[0]  # exactly the float32 losses, as the plain loop logs them
        return loss.tolist(), (100.0 * stats[1] / stats[2]).tolist(), 100.0 * float(stats[1].sum() / stats[2].sum())

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's 1-D tensor in rank order; the lengths may differ."""
        if not self.multi_process:
            return t
        if self.host_staged:  # gloo gathers host tensors only
            return self._gather(t.cpu()).to(t.device)
        return self._gather(t)

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        sizes = [torch.zeros(1, dtype=torch.long, device=t.device) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([t.numel()], device=t.device))
        longest = int(max(s.item() for s in sizes))
        padded = torch.zeros(longest, dtype=t.dtype, device=t.device)
        padded[: t.numel()] = t
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return torch.cat([part[: int(s.item())] for part, s in zip(parts, sizes)])

    def broadcast_buffers(self, model: nn.Module) -> None:
        """Rank 0's buffers (BatchNorm running statistics) on every rank, so a sharded evaluation
        scores one model — the one rank 0 checkpoints."""
        if self.multi_process:
            with torch.no_grad():
                for b in model.buffers():
                    with on_host(b, self.host_staged) as h:
                        dist.broadcast(h, src=0)

    def raise_if_peer_failure(self, exc: BaseException) -> None:
        """Re-raise a failed collective as one clear line (the caller re-raises anything else)."""
        raise_if_peer_failure(exc, self.rank, self.world_size, self.timeout_s)

    def close(self) -> None:
        if isinstance(self._reducer, RingAllReduce):
            self._reducer.close()
        if self.owns_group:
            release_group()  # a group of one only: a rank with peers ends by launch.end_worker
            self.owns_group = False


class on_host:
    """`with on_host(t, staged) as h:` a collective on `h`: `t` itself, or (a mixed world) a host copy
    of it whose result is copied back. gloo moves host memory; staging here keeps every rank's call the
    same whatever its device, instead of relying on gloo's partial CUDA support."""

    def __init__(self, t: torch.Tensor, staged: bool):
        self.t, self.h = t, (t.cpu() if staged and t.device.type != "cpu" else t)

    def __enter__(self) -> torch.Tensor:
        return self.h

    def __exit__(self, *exc):
        if exc[0] is None and self.h is not self.t:
            self.t.copy_(self.h)
        return False


def parse_rank_devices(spec: str | None) -> list[str] | None:
    """`--rank-devices cpu,cuda`: one device per rank, in rank order (None: every rank on --device)."""
    if spec is None:
        return None
    devices = [d.strip() for d in spec.split(",")]
    ok = all(d == "cpu" or d == "cuda" or (d.startswith("cuda:") and d[5:].isdigit()) for d in devices)
    if len(devices) < 2 or not ok:
        raise ConfigError(
            f"--rank-devices {spec!r}: expected one device per rank, at least 2, each cpu, cuda or cuda:N (e.g. cpu,cuda)"
        )
    return devices


def check_rank_devices(spec: str | None, parallel: str, device: str, nproc: int) -> None:
    """Before any process starts: a mixed world is the hand-written all-reduce, one device per rank."""
    devices = parse_rank_devices(spec)
    if devices is None:
        return
    if parallel != "allreduce":
        raise ConfigError(
            f"--rank-devices {spec}: a mixed CPU + GPU world runs the hand-written all-reduce over gloo; "
            f"use --parallel allreduce (got --parallel {parallel})"
        )
    if len(devices) != nproc:
        raise ConfigError(f"--rank-devices {spec}: {len(devices)} devices for --nproc {nproc} (one per rank)")
    if device != "auto":
        raise ConfigError(f"--rank-devices {spec} with --device {device}: each rank's device comes from --rank-devices")
    for d in devices:
        if d != "cpu":
            resolve_device(d)  # a GPU that is not there fails here, naming it


def _setup_mixed(mode: str, spec: str, global_batch: int, step_timing: bool, timeout_s: float | None):
    """A world whose ranks compute on different device kinds (one CPU rank + one GPU rank): the group
    is gloo (NCCL has no CPU ranks), created as a CPU group; each rank then takes its own device, and
    every collective is staged through host memory (`on_host`)."""
    devices = parse_rank_devices(spec)
    timeout_s = timeout_s if timeout_s is not None else dist_timeout_s()
    already = dist.is_initialized()
    info = init_distributed(backend="gloo", device="cpu", timeout_s=timeout_s)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (info.rank, info.world_size)
    if len(devices) != world:
        raise ConfigError(f"--rank-devices {spec}: {len(devices)} devices for a world of {world} ranks")
    _check_batch_covers_ranks(global_batch, world, "the world size")
    dev = resolve_device(devices[rank])
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return DataParallelContext(
        mode=mode,
        rank=rank,
        world_size=world,
        device=dev,
        timeout_s=timeout_s,
        owns_group=not already and dist.is_initialized(),
        host_staged=True,
        timer=StepTimer(dev, step_timing),
    )


def _timed_allreduce_hook(timer: StepTimer, bucket):
    """DDP's default all-reduce (SUM then divide by world size), timed from launch to completion.
    On CUDA the completion callback fires when the work is done on the stream as seen by the host,
    so the figure is approximate there; on CPU (gloo) it is the transfer's wall time."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    t0 = time.perf_counter()
    fut = allreduce_hook(None, bucket)

    def done(f):
        timer.add_comm(time.perf_counter() - t0)
        return f.value()

    return fut.then(done)


def check_data_parallel(device: str, global_batch: int) -> int:
    """The number of GPUs DataParallel would use; a clear error when it cannot be meaningful."""
    if device not in ("auto", "cuda") and not str(device).startswith("cuda"):
        raise ConfigError(
            f"--parallel dp with --device {device}: nn.DataParallel splits batches over CUDA GPUs; "
            "use --device cuda (or --parallel ddp/allreduce on the CPU)"
        )
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        raise HardwareError(
            f"--parallel dp needs at least 2 CUDA GPUs, found {n}: nn.DataParallel on one device "
            "is single-device training with extra copies (use --parallel none)"
        )
    # A batch the GPUs do not divide is fine: scatter gives the last GPU a smaller chunk, and the loss is
    # computed on the outputs gathered on GPU 0, so uneven chunks weigh every image alike.
    if global_batch < n:
        raise ConfigError(f"--batch-size {global_batch} is smaller than the {n} GPUs nn.DataParallel splits it over")
    return n


def wrap_data_parallel(model: nn.Module) -> nn.DataParallel:
    """Wrap a model that lives on cuda:0 in DataParallel over all visible GPUs (call check_data_parallel first)."""
    return nn.DataParallel(model, device_ids=list(range(torch.cuda.device_count())), output_device=0)


def check_launch(mode: str, nproc: int, device: str, global_batch: int) -> None:
    """Every reason a data-parallel launch cannot work, checked before any process starts."""
    if mode not in MODES:
        raise ConfigError(f"--parallel {mode!r}: expected one of {', '.join(MODES)}")
    if nproc < 1:
        raise ConfigError(f"--nproc {nproc}: expected a positive number of processes")
    if nproc > 1 and mode not in MULTI_PROCESS_MODES:
        raise ConfigError(
            f"--nproc {nproc} starts {nproc} processes, which needs --parallel ddp, allreduce or ring "
            f"(got --parallel {mode})"
        )
    if mode == "dp":
        check_data_parallel(device, global_batch)
        return
    dev = resolve_device(device)
    if dev.type == "cpu":
        check_process_count(nproc, "--nproc")
    if dev.type == "cuda" and nproc > torch.cuda.device_count():
        raise HardwareError(
            f"--nproc {nproc}: only {torch.cuda.device_count()} CUDA device(s) visible "
            "(one process per GPU; use --device cpu for more processes than GPUs)"
        )
    _check_batch_covers_ranks(global_batch, nproc, "--nproc")


def _check_batch_covers_ranks(global_batch: int, world_size: int, what: str) -> None:
    # Uneven shards are fine (weighted, see DeviceLoader.shard_weights); an empty shard is not.
    if global_batch < world_size:
        raise ConfigError(
            f"--batch-size {global_batch} is smaller than {what} {world_size}: every rank needs "
            "at least one image of each global batch"
        )


def setup_data_parallel(
    mode: str,
    device: str,
    global_batch: int,
    step_timing: bool = False,
    timeout_s: float | None = None,
    rank_devices: str | None = None,
) -> DataParallelContext:
    """Resolve `--parallel MODE` into a context; errors before anything starts.

    ddp/allreduce join the process group described by torchrun's RANK/WORLD_SIZE/LOCAL_RANK (or an
    existing one, as under `spawn_for_test`); without those variables they run as a world of one.
    `rank_devices` ("cpu,cuda"): a mixed world (`--rank-devices`), each rank on its own device kind.
    """
    if rank_devices is not None:
        return _setup_mixed(mode, rank_devices, global_batch, step_timing, timeout_s)
    if mode not in MODES:
        raise ConfigError(f"--parallel {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "none":
        dev = resolve_device(device)
        return DataParallelContext(mode="none", device=dev, timer=StepTimer(dev, step_timing))
    if mode == "dp":
        check_data_parallel(device, global_batch)
        dev = torch.device("cuda", 0)  # the module and the gathered outputs live on GPU 0
        return DataParallelContext(mode="dp", device=dev, timer=StepTimer(dev, step_timing))
    world_size = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    check_launch(mode, 1, device, global_batch)  # device exists; mode is valid
    _check_batch_covers_ranks(global_batch, world_size, "the world size")
    timeout_s = timeout_s if timeout_s is not None else dist_timeout_s()  # --dist-timeout, else the environment
    already = dist.is_initialized()
    info: DistInfo = init_distributed(device=device, timeout_s=timeout_s)
    if dist.is_initialized():
        info = DistInfo(
            rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=info.local_rank, device=info.device
        )
    if mode == "ddp":
        ensure_process_group(info, timeout_s)  # DDP needs a group even for a world of one
    return DataParallelContext(
        mode=mode,
        rank=info.rank,
        world_size=info.world_size,
        device=info.device,
        timeout_s=timeout_s,
        owns_group=not already and dist.is_initialized(),
        timer=StepTimer(info.device, step_timing),
    )
