"""The test images the model gets wrong, kept in the run directory: what a student looks at after
the confusion matrix (is that 4 really a 9? would a person get it right?).

`misclassified.npz` holds the first `MAX_SHOWN` errors in test-set order — raw uint8 pixels, true and
predicted labels, their indices in the test set — and the total number of errors, so the report can
draw the grid without the data set or torch. TensorBoard gets the same grid as `test/misclassified`.
"""

from __future__ import annotations

import io

import numpy as np
import torch

from trainlab.io import atomic_write_bytes

MAX_SHOWN = 36
FILE = "misclassified.npz"


def misclassified(
    predictions: torch.Tensor, images_uint8: np.ndarray, labels: np.ndarray, limit: int = MAX_SHOWN
) -> dict:
    """The first `limit` test images whose prediction differs from the label, in test-set order."""
    labels_t = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    if len(predictions) != len(labels_t):
        raise ValueError(f"{len(predictions)} predictions for {len(labels_t)} test labels")
    wrong = (predictions.cpu() != labels_t).nonzero().flatten()
    index = wrong[:limit].numpy()
    return {
        "index": index,
        "image": np.asarray(images_uint8)[index],
        "label": np.asarray(labels)[index].astype(np.int64),
        "predicted": predictions.cpu().numpy()[index].astype(np.int64),
        "total": np.int64(len(wrong)),
        "tested": np.int64(len(labels_t)),
    }


def save(path, examples: dict) -> None:
    buf = io.BytesIO()
    np.savez_compressed(buf, **examples)
    atomic_write_bytes(path, buf.getvalue())
