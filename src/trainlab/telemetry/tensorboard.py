"""TensorBoard writing, plus the image grids for filters and feature maps.

torchvision's make_grid is not available here (no CPU torchvision build), and a grid is a few lines.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from trainlab.io import record_written


def make_writer(run_dir: Path, enabled: bool = True, purge_step: int | None = None):
    """A SummaryWriter into `run_dir`; its events file goes into the folder's manifest (it names the file itself)."""
    if not enabled:
        return None
    from torch.utils.tensorboard import SummaryWriter

    before = set(Path(run_dir).glob("events.out.tfevents.*"))
    writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge_step)  # creates its events file now
    for new in set(Path(run_dir).glob("events.out.tfevents.*")) - before:
        record_written(new)
    _quiet_writer_thread(writer)
    return writer


def _quiet_writer_thread(writer) -> None:
    """A write error in TensorBoard's writer thread (a full disk) is raised again by the writer in the
    main thread, at its next write or close, where the one write-error line reports it: the thread's own
    traceback is not printed, and the error names the events file (the thread's has no file name)."""
    try:
        thread = writer.file_writer.event_writer._async_writer._worker
        path = writer.file_writer.event_writer._file_name
    except AttributeError:  # another tensorboard layout: its traceback stays
        return
    thread.trainlab_events_file = str(path)
    if getattr(threading.excepthook, "trainlab", False):
        return
    previous = threading.excepthook

    def hook(args) -> None:
        events = getattr(args.thread, "trainlab_events_file", None)
        if events is not None and isinstance(args.exc_value, OSError):
            if args.exc_value.filename is None:
                args.exc_value.filename = events
            return
        previous(args)

    hook.trainlab = True
    threading.excepthook = hook


def image_grid(images: torch.Tensor, ncol: int | None = None, pad: int = 1) -> torch.Tensor:
    """[N, H, W] → [1, rows*(H+pad), cols*(W+pad)] in [0, 1], each tile min-max normalized on its own."""
    images = images.detach().float().cpu()
    n, h, w = images.shape
    ncol = ncol or min(n, 8)
    nrow = (n + ncol - 1) // ncol
    flat = images.reshape(n, -1)
    lo, hi = flat.min(1, keepdim=True).values, flat.max(1, keepdim=True).values
    images = ((flat - lo) / (hi - lo).clamp_min(1e-12)).reshape(n, h, w)
    grid = torch.ones(nrow * (h + pad) + pad, ncol * (w + pad) + pad)
    for i in range(n):
        r, c = divmod(i, ncol)
        grid[pad + r * (h + pad) : pad + r * (h + pad) + h, pad + c * (w + pad) : pad + c * (w + pad) + w] = images[i]
    return grid.unsqueeze(0)
