"""Download the official MNIST files, verified by checksum, written atomically.

Only ever runs when a user asks (`trainlab data fetch`); the default source is the embedded copy.
A file already present with the right checksum is not downloaded again. Each file is held in
memory (the largest is 9.9 MB), its md5 checked, and only then written, so a failed or corrupted
download never leaves a file that looks valid.
"""

from __future__ import annotations

import hashlib
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
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

_CHUNK = 1 << 16
MAX_DOWNLOAD_BYTES = 16 * 2**20  # the largest official file (train-images, gzip) is 9.9 MB


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


def fetch_file(name: str, expected_md5: str, dest: Path, mirrors=MIRRORS, timeout: float = 60.0) -> Path:
    """Make `dest/name` a verified copy of the official file, trying each mirror in turn."""
    target = dest / name
    if target.is_file() and md5_file(target) == expected_md5:
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
        got = md5_bytes(data)
        if got != expected_md5:
            errors.append(f"{url}: md5 {got} != expected {expected_md5}")
            continue
        try:
            atomic_write_bytes(target, data)
        except OSError as e:
            raise DataError(f"{target}: cannot write the download ({e.strerror or e})") from None
        print(f"  {name}: {len(data) / 1e6:.1f} MB from {mirror}, md5 ok", file=sys.stderr)
        return target
    raise DataError(f"{target}: download failed from every mirror ({'; '.join(errors)})")


def fetch_mnist(
    dest: str | os.PathLike, mirrors=MIRRORS, files: dict[str, str] | None = None, timeout: float = 60.0
) -> list[Path]:
    """Download the four official MNIST .gz files into `dest` (checksum-verified, atomic, skip if present)."""
    dest = user_path(dest, "--dir")
    created = not dest.exists()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"{dest}: --dir cannot be created ({e.strerror or e})") from None
    files = FILES_MD5 if files is None else files
    print(f"trainlab: fetching MNIST into {dest}", file=sys.stderr)
    try:
        return [fetch_file(name, md5, dest, mirrors, timeout) for name, md5 in files.items()]
    except DataError:
        if created:  # a fetch that got nothing leaves no empty folder behind
            try:
                dest.rmdir()
            except OSError:
                pass
        raise
