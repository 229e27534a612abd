"""Atomic writes: a crash mid-write never leaves a half-written result or checkpoint behind.

Every file is written to a temporary sibling and then `os.replace`d over the target, which is atomic
on POSIX filesystems. The file gets the mode any other program's new file would get (0666 minus
the umask): `mkstemp` alone creates 0600, which would hide results from the user's group.

JSON has no NaN or infinity: `to_json` refuses them (naming where the value sits) instead of
writing the `NaN` token that strict readers reject. A producer that means "no value" writes None.

`output_problem` says what is wrong with an output path (a file where a directory is wanted, a
directory under a file, no write permission) so a command can refuse it before it starts working.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from trainlab.errors import UserError


def current_umask() -> int:
    """The process umask, read without changing it (Linux: /proc); else the set-and-restore idiom."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _atomic(path: str | os.PathLike, write: Callable[[Any], None], mode: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
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


def to_json(obj: Any, indent: int | None = None) -> str:
    """`json.dumps` that refuses NaN/inf: ValueError naming the key path of the first one."""
    try:
        return json.dumps(obj, indent=indent, default=_json_default, allow_nan=False)
    except ValueError as e:
        where = _nonfinite_path(obj)
        if where is None:
            raise
        raise ValueError(f"refusing to write {where[1]} at {where[0]} as JSON (JSON has no NaN/inf; "
                         "a producer that means 'no value' must write None)") from e


def _nonfinite_path(obj: Any, path: str = "$") -> tuple[str, float] | None:
    if isinstance(obj, float) and not math.isfinite(obj):
        return path, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = _nonfinite_path(value, f"{path}[{key!r}]")
        if found:
            return found
    return None


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, to_json(obj, indent=2) + "\n")


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
    """Read a JSON file; a missing, unreadable or corrupt file is a one-line `UserError` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a JSON file") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied (cannot read it)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None


def output_problem(path: str | os.PathLike, kind: str = "file") -> str | None:
    """What stops trainlab from writing `path` (a "file" or a "dir" it would create), or None.

    Checked before a command starts, so a bad --out/--json/-o costs nothing: a directory where a file
    is wanted (or the reverse), a parent that is a file, or a folder this user cannot write into."""
    path = Path(path).expanduser()
    if path.exists():
        if kind == "dir" and not path.is_dir():
            return "is a file, expected a directory"
        if kind == "file" and path.is_dir():
            return "is a directory, expected a file"
        target = path if kind == "dir" else path.parent
        if not os.access(target, os.W_OK | os.X_OK) or (kind == "file" and not os.access(path, os.W_OK)):
            return "is not writable (permission denied)"
        return None
    parent = path.parent
    while not parent.exists():  # the first existing ancestor decides whether the folders can be created
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot be created: {parent} is a file, not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: {parent} is not writable (permission denied)"
    return None
