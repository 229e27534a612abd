"""Fashion-MNIST: the real files from the Debian package (CI installs it), the accepted layouts, and
damaged or foreign copies, each refused in one line that names the file."""

from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest
from data_fixtures import write_idx_dir

from trainlab.data import fashion_mnist
from trainlab.data.datasets import load_dataset
from trainlab.data.fashion_mnist import DECOMPRESSED_MD5, DEFAULT_DIR, load_fashion_mnist
from trainlab.data.mnist import IDX_STEMS
from trainlab.errors import DataError

real = pytest.mark.skipif(
    not (DEFAULT_DIR / "train-images-idx3-ubyte.gz").exists(),
    reason=f"Fashion-MNIST not installed ({DEFAULT_DIR}; apt-get install dataset-fashion-mnist)",
)


@real
def test_real_files_load_and_verify():
    a = load_dataset("fashion-mnist")
    assert a.train_images.shape == (60000, 28, 28) and a.test_images.shape == (10000, 28, 28)
    assert a.train_images.dtype == np.uint8
    # upstream's first labels: ankle boot, T-shirt, T-shirt, dress, T-shirt, pullover, sneaker, …
    assert a.train_labels[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert a.test_labels[:5].tolist() == [9, 2, 1, 1, 6]
    assert np.bincount(a.train_labels).tolist() == [6000] * 10
    assert "decompressed md5s verified" in a.source
    assert fashion_mnist.decompressed_md5(a) == DECOMPRESSED_MD5


@real
def test_torchvision_layout_with_plain_files(tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for stem in IDX_STEMS.values():
        with gzip.open(DEFAULT_DIR / f"{stem}.gz") as src:
            (raw / stem).write_bytes(src.read())
    a = load_fashion_mnist(tmp_path)
    assert str(raw) in a.source and a.train_labels[0] == 9


@real
def test_truncated_copy_is_one_line(tmp_path):
    for stem in IDX_STEMS.values():
        shutil.copy(DEFAULT_DIR / f"{stem}.gz", tmp_path)
    data = (tmp_path / "t10k-labels-idx1-ubyte.gz").read_bytes()
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.gz: corrupt or truncated gzip data") as e:
        load_fashion_mnist(tmp_path)
    assert "\n" not in str(e.value)


@real
def test_one_changed_label_fails_the_fingerprint(tmp_path):
    for stem in IDX_STEMS.values():
        shutil.copy(DEFAULT_DIR / f"{stem}.gz", tmp_path)
    path = tmp_path / "train-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(path.read_bytes()))
    raw[8] = (raw[8] + 1) % 10  # the first label, still a valid 0-9 label in a valid IDX file
    path.write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(
        DataError,
        match=r"train-labels-idx1-ubyte.gz: not the Fashion-MNIST train labels file "
        r"\(decompressed md5 [0-9a-f]{32}, expected 9018921c3c673c538a1fc5bad174d6f9\)",
    ):
        load_fashion_mnist(tmp_path)


def test_foreign_idx_files_fail_the_fingerprint(tmp_path):
    # valid IDX files of the right shapes that are not Fashion-MNIST (needs no real data)
    write_idx_dir(tmp_path / "raw", gz=True)
    with pytest.raises(DataError, match=r"raw/train-images-idx3-ubyte.gz: not the Fashion-MNIST train images file"):
        load_fashion_mnist(tmp_path)


def test_missing_package_names_it_and_the_flag(monkeypatch, tmp_path):
    monkeypatch.setattr(fashion_mnist, "DEFAULT_DIR", tmp_path / "absent")
    with pytest.raises(DataError) as e:
        load_dataset("fashion-mnist")
    msg = str(e.value)
    assert "Fashion-MNIST not found" in msg and "dataset-fashion-mnist" in msg and "--data-dir DIR" in msg
    assert "\n" not in msg


def test_empty_folder_names_the_layouts(tmp_path):
    with pytest.raises(DataError, match=r"no Fashion-MNIST IDX files here, in raw/ or in FashionMNIST/raw/"):
        load_fashion_mnist(tmp_path)
