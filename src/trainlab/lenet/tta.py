"""Test-time augmentation (TTA): classify each test image from several fixed views and average.

The views are the image itself and copies shifted by one pixel in each of the four directions (the
background fills the uncovered row/column). Softmax probabilities are averaged over the views and the
argmax is the prediction. It costs one forward pass per view and is not the plain test accuracy, so
trainlab reports it separately (`tta_test_accuracy`), never in place of `test_accuracy`.
"""

from __future__ import annotations

import torch

from trainlab.data.augment import apply_affine
from trainlab.data.mnist import BACKGROUND
from trainlab.lenet.setup import autocast

# (dx, dy) in pixels; positive dx moves the digit right, positive dy down.
SHIFTS = ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1))


def shift_matrices(n: int, dx: int, dy: int, height: int, width: int) -> torch.Tensor:
    """`affine_grid` matrices [n, 2, 3] that move an image by (dx, dy) whole pixels."""
    theta = torch.eye(2, 3)
    theta[0, 2], theta[1, 2] = -2 * dx / width, -2 * dy / height
    return theta.expand(n, 2, 3)


def shifted(x: torch.Tensor, dx: int, dy: int) -> torch.Tensor:
    if dx == 0 and dy == 0:
        return x
    return apply_affine(x, shift_matrices(len(x), dx, dy, *x.shape[-2:]), fill=BACKGROUND)


@torch.no_grad()
def evaluate_tta(
    model: torch.nn.Module, batches, device: torch.device, amp_dtype=None, shifts=SHIFTS, par=None
) -> dict:
    """Accuracy (%) of the mean softmax over `shifts` views of every test image. Under data parallelism
    (`par`) `batches` is this rank's shard of the test set and the counts are summed over ranks."""
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    count = torch.zeros((), dtype=torch.long, device=device)
    for x, y in batches:
        probs = 0
        for dx, dy in shifts:
            with autocast(device, amp_dtype):
                probs = probs + model(shifted(x, dx, dy)).float().softmax(1)
        correct += (probs.argmax(1) == y).sum()
        count += len(y)
    model.train(was_training)
    if par is not None:
        par.sum_(correct)
        par.sum_(count)
    n = int(count)
    return {"test_accuracy": 100.0 * int(correct) / max(1, n), "views": len(shifts), "test_samples": n}
