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


# ----------------------------------------------------------------------------- Fashion-MNIST


def test_fashion_checksum_tables_name_the_four_official_files():
    assert list(fetch.FASHION_FILES_MD5) == list(fetch.FILES_MD5) == list(fetch.FASHION_CONTENT_MD5)
    assert all(
        len(v) == 32 and int(v, 16) >= 0
        for v in [*fetch.FASHION_FILES_MD5.values(), *fetch.FASHION_CONTENT_MD5.values()]
    )
    from trainlab.data.fashion_mnist import DECOMPRESSED_MD5  # the loader checks the same content md5s

    assert sorted(DECOMPRESSED_MD5.values()) == sorted(fetch.FASHION_CONTENT_MD5.values())


@pytest.fixture
def fashion(tmp_path, monkeypatch):
    """Upstream-like .gz files (their md5s published), and a Debian-like copy of the same content
    recompressed (other .gz bytes, as the package's are); no network: the mirrors are local."""
    import gzip

    upstream, debian = tmp_path / "upstream", tmp_path / "debian"
    upstream.mkdir()
    debian.mkdir()
    write_idx_dir(upstream, gz=True)
    published, content = {}, {}
    for p in sorted(upstream.glob("*.gz")):
        raw = gzip.decompress(p.read_bytes())
        (debian / p.name).write_bytes(gzip.compress(raw, compresslevel=1, mtime=0))
        assert (debian / p.name).read_bytes() != p.read_bytes()
        published[p.name], content[p.name] = _md5(p), hashlib.md5(raw).hexdigest()
    monkeypatch.setattr(fetch, "FASHION_FILES_MD5", published)
    monkeypatch.setattr(fetch, "FASHION_CONTENT_MD5", content)
    monkeypatch.setattr(fetch, "FASHION_DEBIAN_DIR", debian)
    monkeypatch.setattr(fetch, "FASHION_MIRRORS", ((tmp_path / "no-mirror").as_uri() + "/",))
    return upstream, debian, published, content


def test_fashion_fetch_copies_the_debian_package_checked_by_content(tmp_path, fashion, capsys):
    upstream, debian, published, content = fashion
    assert fetch.fashion_sources()[0] == debian.as_uri() + "/"  # installed: the local copy first
    dest = tmp_path / "dest"
    fetch.fetch_fashion_mnist(dest)
    assert {p.name: _md5(p) for p in dest.glob("*.gz")} == {p.name: _md5(p) for p in debian.glob("*.gz")}
    assert capsys.readouterr().err.count(f"from {debian.as_uri()}/, md5 ok") == 4
    fetch.fetch_fashion_mnist(dest)  # present and right by content: nothing fetched again
    assert capsys.readouterr().err.count("present, md5 ok") == 4


def test_fashion_fetch_takes_the_published_files_and_refuses_other_content(tmp_path, fashion):
    upstream, debian, published, content = fashion
    fetch.fetch_fashion_mnist(tmp_path / "a", mirrors=[upstream.as_uri()])
    assert {p.name: _md5(p) for p in (tmp_path / "a").glob("*.gz")} == published
    name = "t10k-labels-idx1-ubyte.gz"
    other = tmp_path / "other"
    other.mkdir()
    for p in upstream.glob("*.gz"):
        (other / p.name).write_bytes(
            p.read_bytes() if p.name != name else (debian / "train-labels-idx1-ubyte.gz").read_bytes()
        )
    with pytest.raises(
        DataError, match=f"{name}: download failed from every mirror .*its content is not the expected one"
    ):
        fetch.fetch_fashion_mnist(tmp_path / "b", mirrors=[other.as_uri()])
    assert not (tmp_path / "b" / name).exists()


def test_cli_fetch_fashion_mnist(tmp_path, fashion, monkeypatch, capsys):
    from trainlab.data import fashion_mnist

    upstream, debian, published, content = fashion
    monkeypatch.setattr(
        fashion_mnist, "DECOMPRESSED_MD5", {k: content[s + ".gz"] for k, s in fashion_mnist.IDX_STEMS.items()}
    )
    dest = tmp_path / "fm"
    assert main(["data", "fetch", "--dataset", "fashion-mnist", "--dir", str(dest)]) == 0
    assert f"use them with --dataset fashion-mnist --data-dir {dest}" in capsys.readouterr().out
    assert fashion_mnist.load_fashion_mnist(dest).train_labels.shape == (40,)
