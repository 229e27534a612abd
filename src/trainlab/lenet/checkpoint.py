"""Checkpoints: atomic save every epoch, load for --resume and `trainlab eval`."""

from __future__ import annotations

from pathlib import Path

import torch

from trainlab.distributed.wrappers import unwrap
from trainlab.errors import UserError
from trainlab.io import atomic_torch_save


def save_checkpoint(path: Path, *, model, optimizer, scheduler, epoch: int, global_step: int,
                    history: list[dict], train_seconds: float, config: dict, ema: dict | None = None) -> None:
    """`ema` (an `EMA.state_dict()`, with --ema) is stored beside the live weights so a resume is exact."""
    atomic_torch_save(path, {
        "format": "trainlab.lenet.v1",
        "model": unwrap(model).state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epochs_done": epoch,
        "global_step": global_step,
        "history": history,
        "train_seconds": train_seconds,
        "config": config,
        "ema": ema,
    })


def load_checkpoint(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoint.pt"
    if not path.exists():
        raise UserError(f"{path}: checkpoint not found")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated or not a torch file
        raise UserError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != "trainlab.lenet.v1":
        raise UserError(f"{path}: not a trainlab LeNet checkpoint (missing format 'trainlab.lenet.v1')")
    return ckpt
