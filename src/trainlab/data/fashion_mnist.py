"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017): 28×28 grey images of 10 kinds of clothing, in MNIST's
IDX format and split sizes (60,000 / 10,000), so the same reader, loader and models serve it.

Offline source: the Debian package `dataset-fashion-mnist` (bookworm) installs the four `.gz` files
under /usr/share/datasets/fashion-mnist/, the default folder. `--data-dir DIR` takes any folder in
the IDX layout (DIR, DIR/raw) or torchvision's (DIR/FashionMNIST/raw), `.gz` or plain files.

The fingerprint is the md5 of each *decompressed* file: the package's `.gz` files were recompressed,
so their own hashes differ from upstream's, while the bytes inside are upstream's. It is checked on
every load (~0.1 s): a damaged or different file is a one-line `DataError`, never a quiet run on
other data. The decompressed bytes are recomputed from the parsed array (`encode_idx`): the reader
refuses trailing bytes, so the array determines the file exactly.
"""

from __future__ import annotations

import hashlib
import os

from trainlab.data.fetch import FASHION_CONTENT_MD5, FASHION_DEBIAN_DIR
from trainlab.data.idx import encode_idx
from trainlab.data.mnist import IDX_STEMS, MNISTArrays, load_idx_dir
from trainlab.errors import DataError
from trainlab.io import user_path

DEFAULT_DIR = FASHION_DEBIAN_DIR
DEBIAN_PACKAGE = "dataset-fashion-mnist"
TORCHVISION_NAME = "FashionMNIST"

# md5 of the decompressed upstream files (zalandoresearch/fashion-mnist), keyed like IDX_STEMS.
DECOMPRESSED_MD5 = {key: FASHION_CONTENT_MD5[stem + ".gz"] for key, stem in IDX_STEMS.items()}

MISSING_HINT = (
    f"install the Debian package {DEBIAN_PACKAGE} (apt-get install {DEBIAN_PACKAGE}, files in {DEFAULT_DIR}) "
    "or run `trainlab data fetch --dataset fashion-mnist` (then --data-dir data/fashion-mnist), "
    f"or pass --data-dir DIR (the four IDX files, .gz or plain, in DIR, DIR/raw or DIR/{TORCHVISION_NAME}/raw)"
)


def decompressed_md5(arrays: MNISTArrays) -> dict[str, str]:
    """md5 of each array as its uncompressed IDX file (header + payload)."""
    return {key: hashlib.md5(encode_idx(getattr(arrays, key))).hexdigest() for key in IDX_STEMS}


def load_fashion_mnist(data_dir: str | os.PathLike | None = None) -> MNISTArrays:
    """The four Fashion-MNIST arrays from `data_dir` (default: the Debian package's folder), each file's
    decompressed md5 checked against upstream's."""
    folder = user_path(data_dir, "--data-dir") if data_dir is not None else DEFAULT_DIR
    if data_dir is None and not folder.is_dir():
        raise DataError(f"Fashion-MNIST not found in {DEFAULT_DIR}: {MISSING_HINT}")
    arrays = load_idx_dir(folder, what="Fashion-MNIST", torchvision_name=TORCHVISION_NAME, hint=MISSING_HINT)
    for key, digest in decompressed_md5(arrays).items():
        if digest != DECOMPRESSED_MD5[key]:
            raise DataError(
                f"{arrays.paths[key]}: not the Fashion-MNIST {key.replace('_', ' ')} file (decompressed md5 "
                f"{digest}, expected {DECOMPRESSED_MD5[key]}); {MISSING_HINT}"
            )
    arrays.source = f"Fashion-MNIST, {arrays.source} (decompressed md5s verified)"
    return arrays
