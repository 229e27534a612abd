"""`trainlab data fetch`: checksum verification and mirror fallback, against local file:// mirrors only."""

import hashlib

import pytest
from data_fixtures import write_idx_dir

from trainlab.cli import main
from trainlab.data import fetch
from trainlab.errors import DataError, UserError
from trainlab.io import MANIFEST, owned_files, set_force


def _md5(path):
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture
def mirror(tmp_path):
    """A local mirror holding tiny valid .gz IDX files, and their md5s."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    write_idx_dir(folder, gz=True)
    return folder, {p.name: _md5(p) for p in sorted(folder.glob("*.gz"))}  # the IDX files, not trainlab's manifest


def test_verify_checksum(tmp_path):
    path = tmp_path / "f.gz"
    path.write_bytes(b"some bytes")
    fetch.verify_checksum(path, hashlib.md5(b"some bytes").hexdigest())
    with pytest.raises(DataError, match=f"{path}: md5 .* does not match the expected 0+ "):
        fetch.verify_checksum(path, "0" * 32)
    with pytest.raises(DataError, match="file not found"):
        fetch.verify_checksum(tmp_path / "missing", "0" * 32)


def test_official_checksum_table_is_complete():
    assert sorted(fetch.FILES_MD5) == sorted(
        [
            "train-images-idx3-ubyte.gz",
            "train-labels-idx1-ubyte.gz",
            "t10k-images-idx3-ubyte.gz",
            "t10k-labels-idx1-ubyte.gz",
        ]
    )
    assert all(len(v) == 32 and int(v, 16) >= 0 for v in fetch.FILES_MD5.values())


def test_fetch_falls_back_to_the_next_mirror_and_skips_present_files(tmp_path, mirror, capsys):
    folder, md5s = mirror
    dest = tmp_path / "dest"
    mirrors = [(tmp_path / "empty").as_uri() + "/", folder.as_uri() + "/"]
    paths = fetch.fetch_mnist(dest, mirrors=mirrors, files=md5s)
    assert sorted(p.name for p in paths) == sorted(md5s)
    assert all(_md5(dest / name) == md5 for name, md5 in md5s.items())
    assert not [p for p in dest.iterdir() if p.name.startswith(".") and p.name != MANIFEST]  # no temp files left
    assert owned_files(dest) == set(md5s)  # what it fetched is recorded as trainlab's own
    fetch.fetch_mnist(dest, mirrors=["file:///nonexistent/"], files=md5s)  # all present: no download needed
    assert capsys.readouterr().err.count("present, md5 ok") == 4


def test_checksum_mismatch_on_every_mirror_writes_nothing(tmp_path, mirror):
    folder, md5s = mirror
    wrong = {name: "0" * 32 for name in md5s}
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match="download failed from every mirror .*md5 .* != expected 0+"):
        fetch.fetch_mnist(dest, mirrors=[folder.as_uri()], files=wrong)
    assert not dest.exists()  # a fetch that got nothing leaves no empty folder behind


def test_corrupt_existing_file_is_replaced(tmp_path, mirror):
    folder, md5s = mirror
    dest = tmp_path / "dest"
    dest.mkdir()
    name = "t10k-labels-idx1-ubyte.gz"
    (dest / name).write_bytes(b"garbage")
    # not trainlab's file: replaced only when asked (--force), never silently (issue 20, class 1)
    with pytest.raises(UserError, match=f"{name}: already exists and trainlab did not write it"):
        fetch.fetch_mnist(dest, mirrors=[folder.as_uri()], files=md5s)
    assert (dest / name).read_bytes() == b"garbage"
    set_force(True)
    try:
        fetch.fetch_mnist(dest, mirrors=[folder.as_uri()], files=md5s)
    finally:
        set_force(False)
    assert _md5(dest / name) == md5s[name]


def test_cli_fetch(tmp_path, mirror, monkeypatch, capsys):
    folder, md5s = mirror
    monkeypatch.setattr(fetch, "FILES_MD5", md5s)
    dest = tmp_path / "dest"
    assert main(["data", "fetch", "--dir", str(dest), "--mirror", folder.as_uri()]) == 0
    assert "fetched 40 train / 12 test images" in capsys.readouterr().out
    assert main(["data", "fetch", "--dir", str(tmp_path / "d2"), "--mirror", (tmp_path / "no").as_uri()]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("trainlab: error: ") and "download failed from every mirror" in err


def test_fetch_into_unwritable_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = main(["data", "fetch", "--dir", str(blocker / "sub"), "--mirror", "file:///nonexistent/"])
    assert line == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        err.startswith("trainlab: error: ")
        and f"--dir '{blocker / 'sub'}': cannot be created: {blocker} is a file" in err
    )
