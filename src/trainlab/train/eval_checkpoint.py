"""`trainlab eval CHECKPOINT`: rebuild the model a checkpoint was trained with and re-test it."""

from __future__ import annotations

from trainlab.config import TrainConfig
from trainlab.data.mnist import load_mnist
from trainlab.device import resolve_device
from trainlab.train.checkpoint import load_checkpoint
from trainlab.train.evaluate import evaluate
from trainlab.train.loop import build_test_batches
from trainlab.train.setup import amp_dtype, build_model


def evaluate_checkpoint(path, device: str = "auto", data_dir: str | None = None) -> dict:
    ckpt = load_checkpoint(path)
    cfg = TrainConfig.from_dict(ckpt["config"])
    cfg.device, cfg.test_subset = device, None
    if data_dir is not None:
        cfg.data_dir = data_dir
    dev = resolve_device(device)
    model = build_model(cfg, dev)
    model.load_state_dict(ckpt["model"])
    result = evaluate(model, build_test_batches(cfg, load_mnist(cfg.data_dir), dev), dev, amp_dtype(cfg, dev))
    return {**result, "device": str(dev), "epochs_done": ckpt["epochs_done"], "checkpoint": str(path)}
