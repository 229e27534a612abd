"""IDX files, the format MNIST is distributed in: read, validate, write.

Layout (big-endian): two zero bytes, a dtype byte (0x08 = unsigned byte, the only one MNIST uses),
a byte with the number of dimensions, one uint32 per dimension, then the payload in C order.
So labels start with magic 0x00000801 and images with 0x00000803. Files may be gzip-compressed.

Every problem with a file is a one-line `DataError` that starts with the file's path.

A header is checked before anything is allocated: the declared payload must fit the file (raw: its
size exactly; gzip: deflate's ratio limit and `MAX_DATA_BYTES`), so a crafted
16-byte header cannot make trainlab allocate gigabytes; a gzip stream is decompressed into the declared
buffer and no further (the decompression cap).
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from trainlab.errors import DataError
from trainlab.io import atomic_write_bytes, input_problem, read_errors

UBYTE = 0x08  # the IDX dtype code for unsigned bytes
LABELS_MAGIC = 0x00000801
IMAGES_MAGIC = 0x00000803
_GZIP_MAGIC = b"\x1f\x8b"
_SUPPORTED_NDIM = (1, 3)  # MNIST labels and images; anything else is not an MNIST file
# The largest payload one IDX file may declare: 5x MNIST's training images (47 MB). Shared by the pack
# reader. A header declaring more is not an MNIST-like file, and reading it could exhaust memory.
MAX_DATA_BYTES = 256 << 20
DEFLATE_MAX_RATIO = 1032  # deflate cannot expand data by more (RFC 1951: a 258-byte match in ~2 bits)


def _parse_header(head: bytes, total: int, name: str) -> tuple[tuple[int, ...], int]:
    """Validate an IDX header against the total byte count → (dims, header length)."""
    dims, header = _parse_dims(head, total, name)
    expected = math.prod(dims)  # exact: a crafted header's product must not wrap around as an int64 would
    found = total - header
    if found < expected:
        raise DataError(f"{name}: truncated: dims {list(dims)} need {expected} data bytes, found {found}")
    if found > expected:
        raise DataError(f"{name}: {found - expected} unexpected trailing bytes after dims {list(dims)}")
    _check_limit(dims, name)
    return dims, header


def _parse_dims(head: bytes, total: int, name: str) -> tuple[tuple[int, ...], int]:
    """The dims an IDX header declares (magic checked; `total` bounds the header) → (dims, header length)."""
    if total < 4:
        raise DataError(f"{name}: truncated IDX file ({total} bytes, header needs at least 4)")
    zero, dtype, ndim = struct.unpack(">HBB", head[:4])
    magic = struct.unpack(">I", head[:4])[0]
    if zero != 0 or dtype != UBYTE or ndim not in _SUPPORTED_NDIM:
        raise DataError(
            f"{name}: wrong magic number 0x{magic:08x}, expected 0x{LABELS_MAGIC:08x} (labels) "
            f"or 0x{IMAGES_MAGIC:08x} (images)"
        )
    header = 4 + 4 * ndim
    if total < header:
        raise DataError(f"{name}: truncated IDX header ({total} bytes, expected {header})")
    if len(head) < header:
        raise DataError(f"{name}: truncated IDX header ({len(head)} bytes, expected {header})")
    return struct.unpack(f">{ndim}I", head[4:header]), header


def _check_limit(dims: tuple[int, ...], name: str) -> None:
    if math.prod(dims) > MAX_DATA_BYTES:
        raise DataError(
            f"{name}: dims {list(dims)} declare {math.prod(dims)} data bytes, more than the "
            f"{MAX_DATA_BYTES >> 20} MiB an MNIST-like IDX file may hold; refusing to allocate it"
        )


def _read_gzip(f, name: str) -> np.ndarray:
    """A gzip IDX file: the declared size checked against the file before allocating, then decompressed
    into a buffer of exactly that size (never more)."""
    compressed = os.fstat(f.fileno()).st_size
    if compressed < 18:  # 10-byte header + 8-byte trailer
        raise DataError(f"{name}: corrupt or truncated gzip data ({compressed} bytes)")
    f.seek(0)
    with gzip.GzipFile(fileobj=f) as gz:
        head = gz.read(_MAX_HEADER)
        dims, header = _parse_dims(head, len(head), name)
        _check_limit(dims, name)
        total = header + math.prod(dims)
        if total > compressed * DEFLATE_MAX_RATIO:
            raise DataError(
                f"{name}: corrupt or truncated gzip data: dims {list(dims)} declare {total} bytes, more "
                f"than a {compressed}-byte gzip file can hold (deflate expands at most {DEFLATE_MAX_RATIO}x)"
            )
        buf = bytearray(total)
        buf[: len(head)] = head
        view, filled = memoryview(buf), len(head)
        while filled < total:
            n = gz.readinto(view[filled:])
            if not n:
                raise DataError(
                    f"{name}: truncated: dims {list(dims)} need {total - header} data bytes, found {filled - header}"
                )
            filled += n
        if gz.read(1):
            raise DataError(f"{name}: unexpected trailing bytes after dims {list(dims)}")
    return np.frombuffer(buf, dtype=np.uint8, offset=header).reshape(dims)


_MAX_HEADER = 4 + 4 * max(_SUPPORTED_NDIM)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (raw or gzip, detected by content) into a writable uint8 array of its declared shape.

    Raises `DataError("<path>: ...")` for a missing, truncated or wrong-magic file.
    """
    path = Path(path)
    problem = input_problem(path)
    if problem:
        raise DataError(f"{path}: {problem}")
    try:
        with read_errors(path, "an IDX file", DataError), open(path, "rb") as f:
            head = f.read(_MAX_HEADER)
            if head[:2] == _GZIP_MAGIC:
                f.seek(0)
                return _read_gzip(f, str(path))
            # Raw file: validate the header against the file size, then read the payload straight
            # into the array (one copy; this is what makes the cached MNIST load fast).
            dims, header = _parse_header(head, os.fstat(f.fileno()).st_size, str(path))
            f.seek(header)
            return np.fromfile(f, dtype=np.uint8, count=math.prod(dims)).reshape(dims)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{path}: corrupt or truncated gzip data ({e})") from None


def encode_idx(array: np.ndarray) -> bytes:
    """IDX bytes for a uint8 array of 1 or 3 dimensions."""
    array = np.asarray(array)
    if array.dtype != np.uint8:
        raise ValueError(f"IDX writer supports uint8 only, got {array.dtype}")
    if array.ndim not in _SUPPORTED_NDIM:
        raise ValueError(f"IDX writer supports 1-D (labels) or 3-D (images) arrays, got {array.ndim}-D")
    header = struct.pack(">HBB", 0, UBYTE, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array).tobytes()


def write_idx(path: str | os.PathLike, array: np.ndarray, private: bool = False) -> Path:
    """Write `array` (uint8, 1-D or 3-D) as IDX, gzip-compressed if `path` ends in .gz; atomic.
    `private`: trainlab's own cache (see `trainlab.io`)."""
    data = encode_idx(array)
    if str(path).endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)  # mtime=0: same bytes for same data
    return atomic_write_bytes(path, data, private)
