"""Atomic writes: a crash mid-write never leaves a half-written result or checkpoint behind.

Every file is written to a temporary sibling and then `os.replace`d over the target, which is atomic
on POSIX filesystems.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from trainlab.errors import UserError


def _atomic(path: str | os.PathLike, write: Callable[[Any], None], mode: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return _atomic(path, lambda f: f.write(text), "w")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return _atomic(path, lambda f: f.write(data), "wb")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    import torch

    return _atomic(path, lambda f: torch.save(obj, f), "wb")


def _json_default(o: Any) -> Any:
    # numpy scalars/arrays and Paths show up in results; make them plain JSON.
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; a missing or corrupt file is a one-line `UserError` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
