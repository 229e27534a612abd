"""Download the official MNIST or Fashion-MNIST files, verified by checksum, written atomically.

Only ever runs when a user asks (`trainlab data fetch [--dataset fashion-mnist]`); MNIST's default source
is the embedded copy. A file already present with the right checksum is not downloaded again. Each file
is held in memory (the largest is 26 MB), its md5 checked, and only then written, so a failed or
corrupted download never leaves a file that looks valid.

Fashion-MNIST's first source is the Debian package `dataset-fashion-mnist` where it is installed (a local
copy, no network); its `.gz` files were recompressed, so a file is also accepted when its *decompressed*
bytes have upstream's md5 (the check `data.fashion_mnist` applies on every load).
"""

from __future__ import annotations

import hashlib
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

from trainlab.errors import DataError
from trainlab.io import atomic_write_bytes, input_problem, progress_bar, user_path

# Tried in order; the S3 mirror is the one torchvision uses, yann.lecun.com is often throttled.
MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)

# md5 of the official gzip files (the checksums torchvision and most loaders pin).
FILES_MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}

# Fashion-MNIST (zalandoresearch/fashion-mnist): the published .gz md5s (as torchvision pins them) and the
# md5 of each file decompressed (what a recompressed copy, Debian's, still matches).
FASHION_MIRRORS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)
FASHION_FILES_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
FASHION_CONTENT_MD5 = {
    "train-images-idx3-ubyte.gz": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte.gz": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte.gz": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte.gz": "15d484375f8d13e6eb1aabb0c3f46965",
}
FASHION_DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")  # `apt-get install dataset-fashion-mnist`

_CHUNK = 1 << 16
MAX_DOWNLOAD_BYTES = 32 * 2**20  # the largest official file (Fashion-MNIST's train-images, gzip) is 26 MB
MAX_IDX_BYTES = 48 * 2**20  # the largest decompressed file (train-images) is 47,040,016 bytes


def md5_bytes(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def md5_file(path: str | os.PathLike) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checksum(path: str | os.PathLike, expected_md5: str) -> None:
    """Raise a one-line `DataError` if `path` is missing or its md5 is not `expected_md5`."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    got = md5_file(path)
    if got != expected_md5:
        raise DataError(f"{path}: md5 {got} does not match the expected {expected_md5} (corrupt or wrong file)")


def content_md5(data: bytes) -> str | None:
    """md5 of a .gz file's decompressed bytes (at most MAX_IDX_BYTES of them), or None if it is no gzip."""
    unzip = zlib.decompressobj(wbits=31)
    try:
        raw = unzip.decompress(data, MAX_IDX_BYTES + 1)
    except zlib.error:
        return None
    return md5_bytes(raw) if len(raw) <= MAX_IDX_BYTES and unzip.eof else None


def _matches(data: bytes, expected_md5: str, expected_content_md5: str | None) -> str | None:
    """None if `data` is the file: its md5 is the published one, or its decompressed bytes' md5 is the
    expected content md5 (a recompressed copy); else what differs."""
    got = md5_bytes(data)
    if got == expected_md5 or (expected_content_md5 is not None and content_md5(data) == expected_content_md5):
        return None
    return f"md5 {got} != expected {expected_md5}" + (
        f" (and its content is not the expected one, md5 {expected_content_md5})" if expected_content_md5 else ""
    )


def _download(url: str, timeout: float) -> bytes:
    """Fetch `url` into memory (at most MAX_DOWNLOAD_BYTES), one progress line on stderr. A file:// mirror
    must name regular files: a FIFO would block the open for ever, /dev/zero would never end."""
    if urllib.parse.urlparse(url).scheme == "file":
        problem = input_problem(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
        if problem:
            raise ValueError(problem)
    request = urllib.request.Request(url, headers={"User-Agent": "trainlab"})  # some mirrors reject urllib's UA
    with urllib.request.urlopen(request, timeout=timeout) as response:
        total = int(response.headers.get("Content-Length") or 0)
        chunks, done = [], 0
        bar = progress_bar(total=total or None, unit="B", unit_scale=True, desc=url.rsplit("/", 1)[-1], leave=False)
        if total > MAX_DOWNLOAD_BYTES:
            raise ValueError(
                f"declares {total:,} bytes, more than the {MAX_DOWNLOAD_BYTES // 2**20} MiB an MNIST file has"
            )
        for chunk in iter(lambda: response.read(_CHUNK), b""):
            chunks.append(chunk)
            done += len(chunk)
            if done > MAX_DOWNLOAD_BYTES:
                bar.close()
                raise ValueError(
                    f"sent more than the {MAX_DOWNLOAD_BYTES // 2**20} MiB an MNIST file has; stopped reading"
                )
            bar.update(len(chunk))
        bar.close()
    return b"".join(chunks)


def fetch_file(
    name: str,
    expected_md5: str,
    dest: Path,
    mirrors=MIRRORS,
    timeout: float = 60.0,
    expected_content_md5: str | None = None,
) -> Path:
    """Make `dest/name` a verified copy of the official file, trying each mirror in turn."""
    target = dest / name
    if (
        target.is_file()
        and target.stat().st_size <= MAX_DOWNLOAD_BYTES
        and _matches(target.read_bytes(), expected_md5, expected_content_md5) is None
    ):
        print(f"  {name}: present, md5 ok", file=sys.stderr)
        return target
    errors = []
    for mirror in mirrors:
        url = mirror.rstrip("/") + "/" + name
        try:
            data = _download(url, timeout)
        except (urllib.error.URLError, OSError, ValueError) as e:
            errors.append(f"{url}: {getattr(e, 'reason', e)}")
            continue
        problem = _matches(data, expected_md5, expected_content_md5)
        if problem is not None:
            errors.append(f"{url}: {problem}")
            continue
        try:
            atomic_write_bytes(target, data)
        except OSError as e:
            raise DataError(f"{target}: cannot write the download ({e.strerror or e})") from None
        print(f"  {name}: {len(data) / 1e6:.1f} MB from {mirror}, md5 ok", file=sys.stderr)
        return target
    raise DataError(f"{target}: download failed from every mirror ({'; '.join(errors)})")


def fetch_mnist(
    dest: str | os.PathLike,
    mirrors=MIRRORS,
    files: dict[str, str] | None = None,
    timeout: float = 60.0,
    content: dict[str, str] | None = None,
    what: str = "MNIST",
) -> list[Path]:
    """Download the four official .gz files into `dest` (checksum-verified, atomic, skip if present):
    MNIST's by default; `files` (name → published md5), `content` (name → decompressed md5) and `what`
    name another set (`fetch_fashion_mnist`)."""
    dest = user_path(dest, "--dir")
    created = not dest.exists()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"{dest}: --dir cannot be created ({e.strerror or e})") from None
    files = FILES_MD5 if files is None else files
    print(f"trainlab: fetching {what} into {dest}", file=sys.stderr)
    try:
        return [fetch_file(name, md5, dest, mirrors, timeout, (content or {}).get(name)) for name, md5 in files.items()]
    except DataError:
        if created:  # a fetch that got nothing leaves no empty folder behind
            try:
                dest.rmdir()
            except OSError:
                pass
        raise


def fashion_sources(mirrors=FASHION_MIRRORS) -> tuple[str, ...]:
    """Where Fashion-MNIST comes from: the Debian package's folder first where it is installed, then `mirrors`."""
    local = (
        (FASHION_DEBIAN_DIR.as_uri() + "/",) if (FASHION_DEBIAN_DIR / next(iter(FASHION_FILES_MD5))).is_file() else ()
    )
    return local + tuple(mirrors)


def fetch_fashion_mnist(dest: str | os.PathLike, mirrors=None, timeout: float = 60.0) -> list[Path]:
    """The four Fashion-MNIST .gz files into `dest`, from `mirrors` (default: `fashion_sources()`)."""
    return fetch_mnist(
        dest,
        mirrors=fashion_sources() if mirrors is None else mirrors,
        files=FASHION_FILES_MD5,
        timeout=timeout,
        content=FASHION_CONTENT_MD5,
        what="Fashion-MNIST",
    )
