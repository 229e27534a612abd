"""`--dataset`: which 28×28 ten-class image set a run trains on. Both come as the same four uint8
arrays (`MNISTArrays`), so everything downstream (loader, augmentation, models) is shared.

Pixels of both sets are normalized with MNIST's mean/std (`mnist.normalize`, one lookup table): a
fixed affine map of the inputs that the first layer (and BatchNorm) absorbs, which keeps one
normalization mechanism and one augmentation fill value.
"""

from __future__ import annotations

import os

from trainlab.data.fashion_mnist import load_fashion_mnist
from trainlab.data.mnist import MNISTArrays, describe_source, load_mnist
from trainlab.errors import ConfigError

DATASETS = ("mnist", "fashion-mnist")


def load_dataset(name: str = "mnist", data_dir: str | os.PathLike | None = None) -> MNISTArrays:
    """The arrays of `--dataset name` from `--data-dir` (or the dataset's default source)."""
    if name == "mnist":
        return load_mnist(data_dir)
    if name == "fashion-mnist":
        return load_fashion_mnist(data_dir)
    raise ConfigError(f"--dataset {name!r}: expected one of {', '.join(DATASETS)}")


def describe_dataset(name: str, arrays: MNISTArrays) -> str:
    """The data line every run prints: MNIST's says whether it is the official set byte for byte
    (`mnist.describe_source`); Fashion-MNIST refuses to load unless its md5s match, so its source says so."""
    return describe_source(arrays) if name == "mnist" else arrays.source
