"""Test-set evaluation: loss, accuracy, per-class accuracy and the confusion matrix; `trainlab eval`.

Under data parallelism every rank scores its shard of the test set and the sums are all-reduced (the
confusion matrix and the loss sum are exact sums, so the result equals one process scoring everything);
the per-image predictions, when asked for, are gathered in test-set order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainlab.data.datasets import describe_dataset, load_dataset
from trainlab.device import resolve_device
from trainlab.lenet.batches import build_test_batches
from trainlab.lenet.checkpoint import checkpoint_config, load_checkpoint, load_model_state
from trainlab.lenet.data_parallel import DataParallelContext
from trainlab.lenet.plan import resolve
from trainlab.lenet.setup import autocast, build_model

NUM_CLASSES = 10


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    batches,
    device: torch.device,
    amp_dtype=None,
    par: DataParallelContext | None = None,
    predictions: bool = False,
) -> dict:
    """`batches` yields (x, y) on `device` (this rank's shard when `par` is data-parallel).
    Accumulates on the device; one sync at the end. `predictions=True` adds "predictions": the
    predicted class of every test image, in order (a LongTensor on the CPU)."""
    was_training = model.training
    model.eval()
    confusion = torch.zeros(NUM_CLASSES, NUM_CLASSES, dtype=torch.long, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    preds = []
    for x, y in batches:
        with autocast(device, amp_dtype):
            logits = model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").double()
        pred = logits.argmax(1)
        confusion += torch.bincount(y * NUM_CLASSES + pred, minlength=NUM_CLASSES**2).view(NUM_CLASSES, NUM_CLASSES)
        if predictions:
            preds.append(pred)
    model.train(was_training)
    gathered = None
    if predictions:
        mine = torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long, device=device)
        gathered = (par.gather(mine) if par is not None else mine).cpu()
    if par is not None:
        par.sum_(confusion)
        par.sum_(loss_sum)
    confusion = confusion.cpu()  # sync point
    n = int(confusion.sum())
    correct = int(confusion.diag().sum())
    per_class_total = confusion.sum(1).clamp_min(1)
    return {
        "test_loss": float(loss_sum) / max(1, n),
        "test_accuracy": 100.0 * correct / max(1, n),
        "per_class_accuracy": (100.0 * confusion.diag() / per_class_total).tolist(),
        "confusion_matrix": confusion.tolist(),
        "test_samples": n,
        **({"predictions": gathered} if predictions else {}),
    }


def evaluate_checkpoint(path, device: str = "auto", data_dir: str | None = None) -> dict:
    """`trainlab eval CHECKPOINT`: rebuild the model a checkpoint was trained with and re-test it."""
    ckpt = load_checkpoint(path)
    cfg = checkpoint_config(ckpt, path)
    cfg.device, cfg.test_subset = device, None
    cfg.step_mode, cfg.compile = "eager", False  # no training step runs here (and `cudagraph` needs CUDA)
    if data_dir is not None:
        cfg.data_dir = data_dir
    dev = resolve_device(device)
    plan = resolve(cfg, dev)
    model = build_model(plan)
    # A run with --ema was evaluated (and reported) with its averaged weights: re-test those.
    load_model_state(model, ckpt["ema"]["model"] if ckpt.get("ema") else ckpt["model"], path)
    data = load_dataset(cfg.dataset, cfg.data_dir)  # the data set the run trained on, never another
    result = evaluate(model, build_test_batches(cfg, data, dev), dev, plan.amp_dtype)
    return {
        **result,
        "dataset": cfg.dataset,
        "data": describe_dataset(cfg.dataset, data),
        "device": str(dev),
        "epochs_done": ckpt["epochs_done"],
        "checkpoint": str(path),
        "weights": "ema" if ckpt.get("ema") else "live",
    }
