"""`--shard-weights auto|W1,W2,…`: data parallelism over devices of unequal speed.

With equal shards every step waits for the slowest rank, so W ranks of throughputs t_1…t_W train at
W·min(t) images/s. Giving rank r a share of every global batch proportional to t_r lets all ranks
finish a step together, approaching the ideal Σ t_r (the notes' automatic-parallelism chapter).
The shares change only *where* each image of the global batch is computed: each rank's mean loss is
weighted by W·n_r/n (`DeviceLoader.shard_weights`), so the averaged gradient, and with it every loss,
equals the single-process run on the same global batches.

`auto` measures each rank's own throughput before training: the training step's forward+backward
(`lenet.step`, eager; the optimizer update costs every rank the same whatever its share) of the
plain (unwrapped) model (≥ 5 steps and ≥ 0.5 s, median rate) on its share of an even split, no communication (a collective would make
every rank wait for the slowest and hide the difference), weights, BatchNorm statistics and optimizer state restored
afterwards; the rates are all-gathered and become the shares.

To show the effect on one CPU, `TRAINLAB_SLOW_RANKS="1:2"` makes rank 1 run at half speed: after
each forward pass that rank sleeps (f−1)·3× the pass's time, about (f−1)× a training step (forward
+ backward ≈ 3 forwards). Sleeping leaves the core to the other ranks, like a slower device would.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

from trainlab.data.loader import shard_bounds
from trainlab.errors import ConfigError

SLOW_ENV = "TRAINLAB_SLOW_RANKS"
AUTO_STEPS = 5  # `auto` times at least this many steps per rank, after one untimed (allocations, kernel choice)
AUTO_SECONDS = 0.5  # … and at least this long, so that a millisecond step is timed many times
AUTO_MAX_STEPS = 200  # … but never more steps than this
MAX_WEIGHT = 1e6  # a --shard-weights value: only ratios matter, and the sum must stay finite
MAX_SLOWDOWN = 1000.0  # a $TRAINLAB_SLOW_RANKS factor: 1000× slower is already a stalled rank


def parse_shard_weights(spec: str | None) -> tuple[float, ...] | str | None:
    """None (even shards), "auto", or the positive weights W1,W2,… as given."""
    if spec is None or spec == "auto":
        return spec
    try:
        weights = tuple(float(w) for w in spec.split(","))
    except ValueError:
        weights = ()
    if len(weights) < 2 or not all(0 < w <= MAX_WEIGHT for w in weights):  # NaN fails too; 1e308s would sum to inf
        raise ConfigError(
            f"--shard-weights {spec!r}: expected auto or one positive number per rank, e.g. 2,1 "
            f"(each finite, > 0 and <= {MAX_WEIGHT:g})"
        )
    return weights


def check_shard_weights(spec: str | None, parallel: str, world_size: int, global_batch: int) -> None:
    """Before any process starts: the spec parses, its count matches the ranks, every rank gets rows."""
    weights = parse_shard_weights(spec)
    if weights is None:
        return
    if parallel not in ("ddp", "allreduce", "ring") or world_size < 2:
        raise ConfigError(
            f"--shard-weights {spec}: splits a global batch across processes; it needs "
            f"--parallel ddp|allreduce|ring with --nproc 2 or more (got --parallel {parallel}, {world_size} process(es))"
        )
    if weights == "auto":
        return
    if len(weights) != world_size:
        raise ConfigError(f"--shard-weights {spec}: {len(weights)} weights for {world_size} ranks (one per rank)")
    empty = [r for r in range(world_size) if len(range(*shard_bounds(global_batch, r, world_size, 0, weights))) == 0]
    if empty:
        raise ConfigError(
            f"--shard-weights {spec}: rank {empty[0]} would get no image of a global batch of {global_batch}; "
            "raise --batch-size or that rank's weight"
        )


def slowdown_factor(rank: int) -> float:
    """This rank's artificial slowdown from $TRAINLAB_SLOW_RANKS ("RANK:FACTOR,…"; 1.0 when unset)."""
    spec = os.environ.get(SLOW_ENV, "").strip()
    if not spec:
        return 1.0
    try:
        table = {int(r): float(f) for r, f in (item.split(":") for item in spec.split(","))}
    except ValueError:
        raise ConfigError(f"${SLOW_ENV}={spec!r}: expected RANK:FACTOR pairs such as 1:2") from None
    if not all(1 <= f <= MAX_SLOWDOWN for f in table.values()):  # NaN and inf fail here too
        raise ConfigError(
            f"${SLOW_ENV}={spec!r}: a factor is a finite number >= 1 and <= {MAX_SLOWDOWN:g} (1 = full speed)"
        )
    if not all(0 <= r < 2**16 for r in table):
        raise ConfigError(f"${SLOW_ENV}={spec!r}: a rank is an integer >= 0")
    return table.get(rank, 1.0)


def install_slowdown(model: torch.nn.Module, rank: int) -> float:
    """Make `model` (the plain module) `factor`× slower on this rank, per $TRAINLAB_SLOW_RANKS; returns the factor."""
    factor = slowdown_factor(rank)
    if factor == 1.0:
        return factor
    started: list[float] = []
    model.register_forward_pre_hook(lambda *_: started.append(time.perf_counter()))

    def pause(*_):
        if model.training:  # evaluation runs at full speed: only the training step is the "slow device"
            time.sleep((factor - 1) * 3 * (time.perf_counter() - started.pop()))
        else:
            started.pop()

    model.register_forward_hook(pause)
    return factor


def measure_shares(step, batches) -> tuple[list[float], float]:
    """(every rank's measured images/s, this rank's): the library's training step's forward+backward
    (`lenet.step`, eager, on the plain model) on this rank's batches of an even split, weights/buffers/grads/optimizer state
    restored; the rates all-gathered (rank order).

    The rate is the median over steps of images/step-time, timed for at least AUTO_STEPS steps and
    AUTO_SECONDS: a LeNet step takes milliseconds, and on a shared machine one preempted step would
    otherwise decide the whole split."""
    batches.set_shares(None)
    batches.set_epoch(0)
    it = iter(batches)
    rates: list[float] = []
    started = time.perf_counter()
    with step.preserved():
        for i in range(AUTO_MAX_STEPS + 1):
            if i > AUTO_STEPS and time.perf_counter() - started >= AUTO_SECONDS:
                break
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(batches)
                x, y = next(it)
            t0 = time.perf_counter()
            # the step's forward/backward only: it scales with a rank's share, the optimizer update does not
            loss, _ = step.forward_backward(x, y)
            float(loss)  # the work's end (a sync on a GPU)
            if i:  # the first step is a warm-up
                rates.append(len(y) / (time.perf_counter() - t0))
            else:
                started = time.perf_counter()
    mine = statistics.median(rates)
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [mine], mine
    # one float per rank, as a Python object: the same call on NCCL, gloo and a mixed CPU + GPU world
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    return [float(p) for p in parts], mine


def setup_shards(spec: str | None, step, batches, par, log=print) -> dict | None:
    """Apply $TRAINLAB_SLOW_RANKS and `--shard-weights` to this rank's `batches`, with `step` the eager
    step over the plain (not yet wrapped) model; returns what the summary records (None for a single
    process with even shards)."""
    if not par.multi_process:
        if spec is not None:
            check_shard_weights(spec, par.mode, par.world_size, batches.batch_size)  # raises: one process
        return None
    factor = install_slowdown(step.module, par.rank)
    weights = parse_shard_weights(spec)
    if weights is not None and weights != "auto":
        check_shard_weights(spec, par.mode, par.world_size, batches.batch_size)
    measured = None
    if weights == "auto":
        measured, _ = measure_shares(step, batches)
        weights = tuple(measured)
        log(
            "shard weights (auto): measured "
            + ", ".join(f"rank {r} {t:,.0f} img/s" for r, t in enumerate(measured))
            + " → rows per global batch "
            + ", ".join(
                str(len(range(*shard_bounds(batches.batch_size, r, par.world_size, 0, weights))))
                for r in range(par.world_size)
            )
        )
    batches.set_shares(weights)
    return {
        "spec": spec,
        "shares": list(weights) if weights is not None else None,
        "measured_images_per_s": measured,
        "slowdown": factor,
    }
