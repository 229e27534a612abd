"""The plan line `trainlab train` (and so `make train`) prints before it trains: the device, the epochs, the
data sizes and how long the training steps should take — measured, not guessed.

The estimate is a calibration on this machine just now: the run's own step (`lenet.step.Step`, after its
warm-up) timed on the first training batch inside `Step.preserved()`, so the
weights, BatchNorm statistics and optimizer state are left exactly as they were and the
run computes what it would have computed without it. Its median step time times the steps still to run is
the estimate; the test-set evaluation after each epoch and a load that changes later are not in it, and the
line says so. Under a captured CUDA graph (its replays would move the optimizer state the graph holds) and
across several processes (a timed step is a collective every rank would have to join) nothing is timed and
the line says that instead.
"""

from __future__ import annotations

import statistics
import time

import torch

from trainlab.device import synchronize
from trainlab.lenet.batches import to_device

CALIBRATION_STEPS = 3  # timed after one untimed step (allocator, caches): the median of these


def calibrate_step(step, batches, device: torch.device, channels_last: bool) -> float | None:
    """Median seconds of one training step on the first batch of epoch 0, the run left as it was; None
    where a step cannot be timed without changing the run (a captured CUDA graph)."""
    if step.graph is not None or step.scaler is not None:  # a GradScaler's scale and growth count would move
        return None
    times = []
    with step.preserved():  # (the loader's shuffling and augmentation draw from their own seeded generators)
        batches.set_epoch(0)
        x, y = to_device(*next(iter(batches)), device, channels_last)
        for i in range(CALIBRATION_STEPS + 1):
            synchronize(device)
            t0 = time.perf_counter()
            step(x, y)
            synchronize(device)
            if i:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 90
        else f"{seconds / 60:.1f} min"
        if seconds < 5400
        else f"{seconds / 3600:.1f} h"
    )


def plan_line(
    device: torch.device,
    epochs: int,
    start_epoch: int,
    n_train: int,
    n_test: int,
    steps: int,
    batch_size: int,
    step_seconds: float | None,
    ranks: int = 1,
) -> str:
    """'plan: 5 epochs on cpu: 60,000 train images (235 steps of 256) ... estimate ≈ 3.1 min ...'.
    `steps` is the number of optimizer steps still to run (all epochs from `start_epoch` on)."""
    todo = epochs - start_epoch
    where = f"{device}" + (f" × {ranks} ranks" if ranks > 1 else "")
    head = (
        f"plan: {todo} epoch{'s' if todo != 1 else ''}"
        + (f" (epochs {start_epoch + 1}-{epochs}, resumed)" if start_epoch else "")
        + f" on {where}: {n_train:,} train images ({steps:,} steps of {batch_size}), {n_test:,} test images "
        "evaluated after each epoch"
    )
    if step_seconds is None:
        why = (
            "a CUDA graph's or GradScaler's steps are not timed apart from the run"
            if ranks == 1
            else "not timed across ranks"
        )
        return f"{head}; estimate: none before training ({why}); the progress bar shows each epoch's time"
    return (
        f"{head}; estimate ≈ {_duration(step_seconds * steps)} of training steps ({step_seconds * 1e3:.1f} ms per "
        f"step, timed on this machine just now over {CALIBRATION_STEPS} steps; evaluation and a changing load "
        "are not in it)"
    )


def announce(cfg, s, step, par) -> str:
    """The plan line of a run being assembled (`lenet.loop`): its parts `s`, its prepared `step`."""
    batches = s.train_batches
    if hasattr(batches, "total_steps"):  # the device loader: epoch 0 is longer under a batch-size warm-up
        steps = batches.total_steps(cfg.epochs) - batches.total_steps(s.start_epoch)
    else:
        steps = len(batches) * (cfg.epochs - s.start_epoch)
    timed = None if par.multi_process else calibrate_step(step, batches, s.device, s.channels_last)
    n_test = getattr(s.test_batches, "n", None) or len(s.data.test_labels)
    return plan_line(
        s.device, cfg.epochs, s.start_epoch, s.n_train, n_test, steps, cfg.batch_size, timed, par.world_size
    )
