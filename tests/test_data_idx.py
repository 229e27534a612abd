"""IDX reader/writer: round trips and every malformed-file case (library error and CLI message)."""

import gzip
import struct

import numpy as np
import pytest
from data_fixtures import write_idx_dir

from trainlab.cli import main
from trainlab.data.idx import read_idx, write_idx
from trainlab.errors import DataError


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("shape", [(7,), (5, 28, 28), (3, 4, 6)])
def test_round_trip(tmp_path, suffix, shape):
    array = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    path = write_idx(tmp_path / f"a{suffix}", array)
    back = read_idx(path)
    assert back.dtype == np.uint8 and back.shape == shape
    np.testing.assert_array_equal(back, array)
    back[...] = 0  # the returned array is writable (torch.from_numpy needs that)


def test_writer_produces_the_official_layout(tmp_path):
    # Independent of our reader: decode the header by hand from the IDX spec.
    labels = np.array([5, 0, 4], dtype=np.uint8)
    images = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    raw_labels = write_idx(tmp_path / "l", labels).read_bytes()
    assert raw_labels == b"\x00\x00\x08\x01" + struct.pack(">I", 3) + bytes([5, 0, 4])
    raw_images = gzip.decompress(write_idx(tmp_path / "i.gz", images).read_bytes())
    assert raw_images[:16] == struct.pack(">IIII", 0x803, 2, 28, 28)
    assert raw_images[16:] == images.tobytes()


def test_gzip_detected_by_content_not_name(tmp_path):
    array = np.arange(10, dtype=np.uint8)
    data = gzip.decompress(write_idx(tmp_path / "x.gz", array).read_bytes())
    (tmp_path / "plain.gz").write_bytes(data)  # raw bytes under a .gz name
    np.testing.assert_array_equal(read_idx(tmp_path / "plain.gz"), array)


def test_writer_rejects_non_mnist_arrays(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        write_idx(tmp_path / "f", np.zeros(3, dtype=np.int32))
    with pytest.raises(ValueError, match="1-D"):
        write_idx(tmp_path / "f", np.zeros((3, 3), dtype=np.uint8))


def _labels_bytes(n=4, declared=None):
    return struct.pack(">II", 0x801, n if declared is None else declared) + bytes(range(n))


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "truncated IDX file"),
        (b"\x00\x00\x08", "truncated IDX file"),
        (b"\x00\x00\x08\x03\x00\x00\x00\x02", "truncated IDX header"),
        (_labels_bytes(4, declared=6), "truncated: dims \\[6\\] need 6 data bytes, found 4"),
        (_labels_bytes(4, declared=2), "2 unexpected trailing bytes"),
        (struct.pack(">II", 0x2049FFFF, 1) + b"\x00", "wrong magic number 0x2049ffff"),
        (struct.pack(">II", 0x00000D01, 1) + b"\x00", "wrong magic number 0x00000d01"),  # float dtype
        (struct.pack(">III", 0x802, 1, 1) + b"\x00", "wrong magic number 0x00000802"),  # 2-D
    ],
)
def test_malformed_files_raise_dataerror_naming_the_file(tmp_path, data, message):
    path = tmp_path / "bad-idx1-ubyte"
    path.write_bytes(data)
    with pytest.raises(DataError, match=message) as err:
        read_idx(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_truncated_gzip(tmp_path):
    path = write_idx(tmp_path / "t.gz", np.zeros((3, 28, 28), dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(DataError, match="corrupt or truncated gzip"):
        read_idx(path)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_idx(tmp_path / "nope")


def _cli_error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("trainlab: error: ")
    return err[-1]


@pytest.mark.parametrize(
    "case, message",
    [
        ("truncated", "truncated: dims"),
        ("magic", "wrong magic number"),
    ],
)
def test_cli_reports_bad_idx_in_one_line(tmp_path, capsys, case, message):
    write_idx_dir(tmp_path)
    target = tmp_path / "t10k-images-idx3-ubyte"
    data = target.read_bytes()
    target.write_bytes(data[:-100] if case == "truncated" else b"\x08\x03\x00\x00" + data[4:])
    line = _cli_error(capsys, ["data", "verify", "--data-dir", str(tmp_path)])
    assert str(target) in line and message in line


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        read_idx(tmp_path)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_truncated_payload_detected_in_both_encodings(tmp_path, suffix):
    data = struct.pack(">IIII", 0x803, 3, 28, 28) + bytes(3 * 28 * 28 - 1)
    path = tmp_path / f"img{suffix}"
    path.write_bytes(gzip.compress(data) if suffix else data)
    with pytest.raises(DataError, match="truncated: dims \\[3, 28, 28\\] need 2352 data bytes, found 2351"):
        read_idx(path)
