"""Atomic writes: a crash mid-write never leaves a half-written result or checkpoint behind.

Every file is written to a temporary sibling and then `os.replace`d over the target, which is atomic
on POSIX filesystems. The file gets the mode any other program's new file would get (0666 minus
the umask): `mkstemp` alone creates 0600, which would hide results from the user's group.

JSON has no NaN or infinity: `to_json` refuses them (naming where the value sits) instead of
writing the `NaN` token that strict readers reject. A producer that means "no value" writes None.

`output_problem` says what is wrong with an output path (a file where a directory is wanted, a
directory under a file, no write permission, a FIFO or device) so a command can refuse it before it
starts working; `input_problem` does the same for a file about to be read (a FIFO would block the read
forever, a device would never end it).

Ownership: trainlab replaces or deletes only files it wrote itself. Every folder it writes into keeps
`.trainlab-files`, the names of the files trainlab wrote there (appended, one per line: concurrent
writers cannot lose each other's lines). The atomic writers refuse to replace an existing file that is
not listed (`foreign`), unless the user passed `--force` (`set_force`, inherited by launched workers
through $TRAINLAB_FORCE), or the folder was claimed by a run (`vet_folder`: `RunDir.claim` made its own
checks), or the caller writes its private files (a cache, a launcher's spec). `refuse_foreign` is the
same check made up front, before a command works, for the files it is going to write; `owned_files`
tells `--overwrite` which files it may delete.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainlab.errors import ConfigError, UserError
from trainlab.schema import MAX_JSON_BYTES, Spec, check, loads

MANIFEST = ".trainlab-files"  # in each folder trainlab writes into: the names of the files it wrote there
MAX_MANIFEST_BYTES = 16 * 2**20  # a folder's file list: far more names than any folder trainlab writes holds
FORCE_ENV = "TRAINLAB_FORCE"
_vetted: set[Path] = set()  # folders whose writes a claim has already vetted (run directories)


def set_force(on: bool) -> None:
    """`--force`: replace existing files trainlab did not write. Launched workers inherit it (environment)."""
    if on:
        os.environ[FORCE_ENV] = "1"
    else:
        os.environ.pop(FORCE_ENV, None)


def _forced() -> bool:
    return os.environ.get(FORCE_ENV) == "1"


def vet_folder(path: str | os.PathLike, on: bool = True) -> None:
    """Writes into `path` skip the ownership check while `on` (a claimed run directory)."""
    key = Path(path).resolve()
    _vetted.add(key) if on else _vetted.discard(key)


def control_problem(path: str | os.PathLike, st: os.stat_result | None = None) -> str | None:
    """What makes `path` not a trainlab control file (`.trainlab.lock`, `.trainlab-files`), or None.

    A control file is trainlab's or nothing: a regular file with one name, owned by the folder's owner
    (or by this user, for a folder such as /tmp). A link would let trainlab truncate or append to the
    file it points at, a FIFO would hang the read, a hard link would be the user's file under a second
    name, and another user's manifest in a shared folder would claim files it does not own."""
    path = Path(path)
    try:
        st = st or os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory"
    kind = next((name for test, name in _SPECIAL if test(st.st_mode)), None)
    if kind:
        return f"is {kind}"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} names (a hard link to another file)"
    try:
        folder_uid = os.stat(path.parent).st_uid
    except OSError:
        folder_uid = os.geteuid()
    if st.st_uid not in (folder_uid, os.geteuid()):
        return f"belongs to uid {st.st_uid}, not to the folder's owner"
    return None


def _control_error(path: Path, problem: str) -> UserError:
    return UserError(
        f"{path}: {problem}, not trainlab's own control file (expected a regular file it wrote); "
        "refusing to use this folder: remove it or choose another folder"
    )


def check_control(path: str | os.PathLike) -> None:
    """`control_problem` as the one-line refusal naming the file (used before a folder is taken)."""
    problem = control_problem(path)
    if problem:
        raise _control_error(Path(path), problem)


def open_control(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """Open a control file without following a link or blocking on a FIFO, and check what was opened
    (on the descriptor: nothing can be swapped in between). Anything but trainlab's own file → one line."""
    path = Path(path)
    extra = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | extra, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _control_error(path, "is a symbolic link") from None
        if e.errno in (errno.EISDIR, errno.ENXIO):  # ENXIO: a FIFO opened for writing with no reader
            raise _control_error(path, control_problem(path) or "is not a regular file") from None
        raise
    problem = control_problem(path, os.fstat(fd))
    if problem:
        os.close(fd)
        raise _control_error(path, problem)
    os.set_blocking(fd, True)
    return fd


def owned_files(folder: str | os.PathLike) -> set[str]:
    """Names of the files trainlab wrote in `folder` (its `.trainlab-files`, read as a control file)."""
    path = Path(folder) / MANIFEST
    try:
        fd = open_control(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return set()  # nothing provably trainlab's: nothing is replaced without --force
    try:
        text = read_fd(fd, path, MAX_MANIFEST_BYTES, "a file list").decode(errors="surrogateescape")
    finally:
        os.close(fd)
    return {line for line in text.splitlines() if line}


def record_written(path: str | os.PathLike) -> None:
    """Add `path` to its folder's `.trainlab-files` (O_APPEND: one short write, never interleaved)."""
    path = Path(path)
    if "\n" in path.name or path.name in owned_files(path.parent):
        return
    fd = open_control(path.parent / MANIFEST, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666 & ~current_umask())
    try:
        with write_errors(path.parent / MANIFEST):
            os.write(fd, (path.name + "\n").encode(errors="surrogateescape"))
    finally:
        os.close(fd)


def foreign(path: str | os.PathLike) -> bool:
    """Whether `path` exists and trainlab did not write it."""
    path = Path(path)
    return (path.exists() or path.is_symlink()) and path.name not in owned_files(path.parent)


def refuse_foreign(paths, flag: str) -> None:
    """Before a command works: one line if it would replace a file trainlab did not write (no --force)."""
    if _forced():
        return
    for p in map(Path, paths):
        if foreign(p) and Path(p).parent.resolve() not in _vetted:
            raise ConfigError(
                f"{flag}: {p} already exists and trainlab did not write it; "
                "pass --force to replace it, or choose another output"
            )


def _check_replace(path: Path) -> None:
    if foreign(path) and not _forced() and path.parent.resolve() not in _vetted:
        raise UserError(
            f"{path}: already exists and trainlab did not write it; refusing to replace it "
            "(pass --force to replace it, or choose another output)"
        )


_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(path: str | os.PathLike) -> str | None:
    """'a FIFO (named pipe)', 'a character device', … for a special file at `path`; None otherwise."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((name for test, name in _SPECIAL if test(mode)), None)


def input_problem(path: str | os.PathLike) -> str | None:
    """What stops trainlab from reading `path` as a data file: a special file (a FIFO blocks the read
    forever, /dev/zero never ends). Missing files are left to the reader's own message."""
    kind = special_kind(path)
    return f"is {kind}, expected a regular file; refusing to read it" if kind else None


def check_input(path: str | os.PathLike) -> Path:
    """`input_problem` as a one-line `UserError` naming the path; returns the path. Every reader calls it."""
    problem = input_problem(path)
    if problem:
        raise UserError(f"{path}: {problem}")
    return Path(path)


def user_path(path: str | os.PathLike, what: str) -> Path:
    """`path` with a leading ~ or ~user expanded; an unknown user is one line naming `what` (the flag or
    variable), not a RuntimeError."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        head = str(path).split(os.sep, 1)[0]
        raise ConfigError(
            f"{what} {str(path)!r}: {head} is not a user of this machine (no home folder to expand)"
        ) from None


def cache_root() -> Path:
    """trainlab's cache folder: $TRAINLAB_CACHE, else $XDG_CACHE_HOME/trainlab, else ~/.cache/trainlab.

    With no home at all (`docker run -u 12345`: no $HOME and no passwd entry, so `Path.home()` raises),
    the fallback is $TMPDIR/trainlab-cache-<uid> (said once on stderr): every command that needs a cache
    still works, and the folder is this user's alone (created 0700)."""
    root = os.environ.get("TRAINLAB_CACHE")
    if root:
        return user_path(root, "$TRAINLAB_CACHE")
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "trainlab"
    try:
        return Path.home() / ".cache" / "trainlab"
    except (RuntimeError, KeyError):
        fallback = Path(tempfile.gettempdir()) / f"trainlab-cache-{os.getuid()}"
        fallback.mkdir(mode=0o700, exist_ok=True)
        st = fallback.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise UserError(
                f"{fallback}: not a folder of this user; this user has no home folder, so set $TRAINLAB_CACHE"
            ) from None
        global _said_fallback
        if not _said_fallback:
            print(
                f"note: no home folder for uid {os.getuid()}; caching in {fallback} ($TRAINLAB_CACHE sets another)",
                file=sys.stderr,
            )
            _said_fallback = True
        return fallback


_said_fallback = False


def contained(root: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Whether `path`, links resolved, lies inside folder `root`: a lab or run folder is a container, and
    a link in it to a file or folder elsewhere is not read (into a report, an archive) as if it were its own."""
    base = os.path.realpath(root)
    return os.path.realpath(path) == base or os.path.realpath(path).startswith(base.rstrip(os.sep) + os.sep)


def progress_bar(iterable=None, enabled: bool = True, **kwargs):
    """A tqdm bar on stderr, only when stderr is a terminal: a log file gets the per-epoch lines, not
    thousands of carriage-return updates. `.disable` tells the caller whether it shows."""
    import sys

    from tqdm import tqdm

    kwargs.setdefault("mininterval", 0.5)
    return tqdm(iterable, disable=not (enabled and sys.stderr.isatty()), dynamic_ncols=True, **kwargs)


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


def _atomic(path: str | os.PathLike, write: Callable[[Any], None], mode: str, private: bool = False) -> Path:
    """`private`: the caller writes its own files (a cache, a spec) and skips the ownership check."""
    path = Path(path)
    kind = special_kind(path)
    if kind:  # os.replace would swap a FIFO or /dev/null itself for a plain file
        raise UserError(f"{path}: is {kind}, expected a regular file; refusing to replace it")
    check_control(path.parent / MANIFEST)  # before anything is written: the file list must be trainlab's
    if not private:
        _check_replace(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        with write_errors(path):
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.fchmod(fd, 0o666 & ~current_umask())
            with os.fdopen(fd, mode) as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        record_written(path)
    except BaseException:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise
    return path


@contextmanager
def write_errors(path: str | os.PathLike):
    """The one write-error line: a failed write (ENOSPC, EFBIG, EROFS, EACCES) names the file being
    written, not a temporary sibling or nothing at all (`os.write` and `f.write` give no file name; the
    CLI prints an OSError as 'PATH: reason'). torch.save's `[enforce fail at inline_container.cc]` is the
    same failure seen through its C++ writer: the OSError underneath it is raised instead."""
    try:
        yield
    except OSError as e:
        if e.filename is None or str(e.filename).endswith(".tmp"):
            raise OSError(e.errno, e.strerror or str(e), os.fspath(path)) from None
        raise
    except RuntimeError as e:
        if "inline_container" not in str(e) and "PytorchStreamWriter" not in str(e):
            raise
        cause = e.__context__ if isinstance(e.__context__, OSError) else None
        if cause is not None:
            raise OSError(cause.errno, cause.strerror, os.fspath(path)) from None
        raise OSError(errno.EIO, "writing it failed (is the disk full?)", os.fspath(path)) from None


def atomic_write_text(path: str | os.PathLike, text: str, private: bool = False) -> Path:
    return _atomic(path, lambda f: f.write(text), "w", private)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, private: bool = False) -> Path:
    return _atomic(path, lambda f: f.write(data), "wb", private)


def to_json(obj: Any, indent: int | None = None) -> str:
    """`json.dumps` that refuses NaN/inf: ValueError naming the key path of the first one."""
    try:
        return json.dumps(obj, indent=indent, default=_json_default, allow_nan=False)
    except ValueError as e:
        where = _nonfinite_path(obj)
        if where is None:
            raise
        raise ValueError(
            f"refusing to write {where[1]} at {where[0]} as JSON (JSON has no NaN/inf; "
            "a producer that means 'no value' must write None)"
        ) from e


def _nonfinite_path(obj: Any, path: str = "$") -> tuple[str, float] | None:
    if isinstance(obj, float) and not math.isfinite(obj):
        return path, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = _nonfinite_path(value, f"{path}[{key!r}]")
        if found:
            return found
    return None


def atomic_write_json(path: str | os.PathLike, obj: Any, private: bool = False) -> Path:
    return atomic_write_text(path, to_json(obj, indent=2) + "\n", private)


def write_json_output(dest: str | os.PathLike, obj: Any) -> None:
    """What `--json DEST` means on every command: `-` prints the JSON to stdout, a path gets it atomically."""
    if os.fspath(dest) == "-":
        sys.stdout.write(to_json(obj, indent=2) + "\n")
        sys.stdout.flush()
    else:
        atomic_write_json(dest, obj)


def atomic_torch_save(path: str | os.PathLike, obj: Any, private: bool = False) -> Path:
    import torch

    return _atomic(path, lambda f: torch.save(obj, f), "wb", private)


def _json_default(o: Any) -> Any:
    # numpy scalars/arrays and Paths show up in results; make them plain JSON.
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, os.PathLike):
        return os.fspath(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


@contextmanager
def read_errors(path: str | os.PathLike, expected: str, error: type[UserError] = UserError):
    """The one wording for a file that cannot be read: missing, a folder, or not readable → one `error` line."""
    try:
        yield
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, expected {expected}") from None
    except PermissionError:
        raise error(f"{path}: permission denied (cannot read it)") from None


def read_capped(path: str | os.PathLike, max_bytes: int, what: str = "a data file") -> bytes:
    """The bytes of `path`, a regular file of at most `max_bytes`: the one way trainlab reads a user's file
    whole. The file is opened without blocking and checked on the open descriptor (a FIFO can neither
    hang the read nor be swapped in after a check), its size is checked before reading, and the read
    stops at the cap even if the file grows meanwhile (/proc files, a file being appended)."""
    with read_errors(path, what):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        return read_fd(fd, path, max_bytes, what)
    finally:
        os.close(fd)


def read_fd(fd: int, path: str | os.PathLike, max_bytes: int, what: str) -> bytes:
    """`read_capped` on an open descriptor: checked with fstat, read up to the cap."""
    st = os.fstat(fd)
    kind = next((name for test, name in _SPECIAL if test(st.st_mode)), None)
    if kind:
        raise UserError(f"{path}: is {kind}, expected a regular file; refusing to read it")
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{path}: is a directory, expected {what}")
    if st.st_size > max_bytes:
        raise UserError(
            f"{path}: {st.st_size:,} bytes, more than the {_size(max_bytes)} {what} may hold; not a file trainlab wrote"
        )
    chunks, total = [], 0
    while total <= max_bytes:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > max_bytes:
        raise UserError(f"{path}: more than the {_size(max_bytes)} {what} may hold; not a file trainlab wrote")
    return b"".join(chunks)


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"


# The one JSON reader: a regular file under a size cap, parsed without NaN or deep nesting
# (`schema.loads`), and checked against a schema (`schema.check`): every problem is one line naming the file.
def read_text(path: str | os.PathLike, max_bytes: int = MAX_JSON_BYTES, what: str = "a JSON file") -> str:
    """The text of `path`: a regular file of at most `max_bytes`, UTF-8 (see `read_capped`)."""
    data = read_capped(path, max_bytes, what)
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not valid JSON (not UTF-8 text: {e.reason} at byte {e.start})") from None


def read_json(path: str | os.PathLike, schema: Spec | None = None, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read, parse and (with `schema`) check one JSON file; every problem is one line naming it."""
    value = loads(read_text(path, max_bytes), str(path))
    return check(value, schema, str(path)) if schema is not None else value


def read_jsonl(path: str | os.PathLike, schema: Spec | None = None, max_bytes: int = MAX_JSON_BYTES) -> list:
    """Read a JSON-lines file (metrics.jsonl): one value per non-blank line, each checked; errors name
    `path:line`."""
    out = []
    for i, line in enumerate(read_text(path, max_bytes).splitlines(), 1):
        if line.strip():
            value = loads(line, f"{path}:{i}")
            out.append(check(value, schema, f"{path}:{i}") if schema is not None else value)
    return out


def output_problem(path: str | os.PathLike, kind: str = "file") -> str | None:
    """What stops trainlab from writing `path` (a "file" or a "dir" it would create), or None.

    Checked before a command starts, so a bad --out/--json/-o costs nothing: a directory where a file
    is wanted (or the reverse), a parent that is a file, a folder this user cannot write into, a special
    file, or (a file) one that exists and trainlab did not write (see `refuse_foreign`)."""
    path = user_path(path, "the path")
    special = special_kind(path)
    if special:
        return f"is {special}, expected a {'directory' if kind == 'dir' else 'regular file'}"
    if path.exists():
        if kind == "dir" and not path.is_dir():
            return "is a file, expected a directory"
        if kind == "file" and path.is_dir():
            return "is a directory, expected a file"
        if kind == "file" and foreign(path) and not _forced() and path.parent.resolve() not in _vetted:
            return "already exists and trainlab did not write it; pass --force to replace it"
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
