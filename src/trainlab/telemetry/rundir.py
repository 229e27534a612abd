"""The run directory: everything a run produced, each file written atomically, and who owns it.

runs/<name>/ config.json  env.json  metrics.jsonl  events.out.tfevents.*  checkpoint.pt  summary.json  gpu.csv
             nvidia-smi-busy.txt (on a GPU: nvidia-smi taken during training: LeNet-5 its second epoch, GPT the timed steps)

Ownership (`RunDir.claim`): a run directory belongs to one writer at a time. The writer holds an
exclusive `flock` on `.trainlab.lock` inside it for the life of the run (the kernel drops it when the
process dies, even by `kill -9`, so a crashed run never blocks its own `--resume`); a second writer
gets one line naming the holder's pid. A directory that already holds files is reused only to continue
its run (`resume=True`) or when the user asked to replace it (`overwrite=True`): then the old run's
files go at the first write, so a start that fails before writing anything (a bad data dir, a missing
GPU) leaves the old run intact. `--overwrite` deletes only the files trainlab wrote there (the folder's
manifest, `trainlab.io.owned_files`; a run written before manifests existed: the run's own file names)
and refuses a folder that holds anything else: a user's notes beside an old config.json are never lost. A start that fails before writing anything also removes the
directories it created: no empty run directory is left behind.

`RunDir(path)` without a claim is a read-only view (a finished run, a non-main rank).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

from trainlab.errors import ConfigError, UserError
from trainlab.io import (
    MANIFEST,
    atomic_write_json,
    atomic_write_text,
    check_control,
    control_problem,
    open_control,
    output_problem,
    owned_files,
    read_fd,
    read_json,
    record_written,
    to_json,
    vet_folder,
    write_errors,
)
from trainlab.text import shown

LOCK_NAME = ".trainlab.lock"
GPU_RANK_FILE = re.compile(r"gpu\.rank\d+\.csv")  # one NVML record per rank (telemetry.gpu.rank_csv_name)
# Files a trainlab run writes: in a run directory written before manifests existed, these are its own.
RUN_FILES = (
    "config.json",
    "env.json",
    "metrics.jsonl",
    "summary.json",
    "checkpoint.pt",
    "gpu.csv",
    "nvidia-smi-busy.txt",
    "misclassified.npz",
)


def _owned(path: Path) -> set[str]:
    """The entries of run directory `path` that trainlab wrote (so --overwrite may delete them)."""
    if (path / MANIFEST).exists():
        return owned_files(path) | {MANIFEST}
    return {
        n
        for n in _entries(path)
        if n in RUN_FILES or n.startswith("events.out.tfevents.") or GPU_RANK_FILE.fullmatch(n) is not None
    }


def _entries(path: Path) -> list[str]:
    """The folder's entries, less its lock: a lock that is not trainlab's own file (a link to a user's
    file) is an entry like any other, so such a folder never counts as empty."""
    try:
        return sorted(e.name for e in path.iterdir() if e.name != LOCK_NAME or control_problem(e) is not None)
    except FileNotFoundError:
        return []


def _listing(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _refusal(path: Path, resume: bool, overwrite: bool, flag: str, resumable: bool) -> str | None:
    """Why `path` cannot be this run's directory (before looking at the lock), or None."""
    problem = output_problem(path, "dir")
    if problem:
        return f"{flag} {path}: {problem}"
    for name in (LOCK_NAME, MANIFEST):
        check_control(path / name)
    if resume:
        return None if path.is_dir() else f"--resume {path}: no such run directory"
    names = [n for n in _entries(path) if n != MANIFEST]
    if not names:
        return None
    if not overwrite:
        resume_hint = f"--resume {path} to continue it, " if resumable else ""
        return (
            f"{path}: already holds a run ({_listing(names)}); pass {resume_hint}--overwrite to replace it, "
            f"or choose another {flag}"
        )
    owned = _owned(path)
    if not owned - {MANIFEST}:
        return (
            f"{path}: not a trainlab run directory (it holds {_listing(names)}); refusing to replace it (--overwrite)"
        )
    # a temporary file of a crashed atomic write is the run's own (see trainlab.io._atomic)
    foreign = [n for n in names if n not in owned and not (n.startswith(".") and n.endswith(".tmp"))]
    if foreign:
        return (
            f"{path}: holds files trainlab did not write ({_listing(foreign)}); refusing to replace the run "
            "(--overwrite deletes only trainlab's own files): move them away or choose another " + flag
        )
    return None


def _holder(lock_path: Path) -> str:
    try:
        fd = open_control(lock_path, os.O_RDONLY)
        try:
            info = json.loads(read_fd(fd, lock_path, 64 * 1024, "a lock file"))
        finally:
            os.close(fd)
        # the command and host are text from a file: through the gate (an escape or newline stays inert)
        return shown(f"pid {info['pid']} on {info['host']}, since {info['started']}: {info['command']}")
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return "pid unknown"


def _try_lock(lock_path: Path) -> int | None:
    """An fd holding the exclusive lock on `lock_path`, or None if another process holds it. The lock is a
    control file (`io.open_control`): a link, FIFO or folder in its place is one line naming it."""
    while True:
        fd = open_control(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise
        try:  # the previous owner may have unlinked the file between our open and our flock: retry
            if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def lock_folder(path: Path, flag: str = "--out", what: str = "trainlab run") -> int:
    """Hold folder `path` for this process (the one lock of run directories and lab folders): an fd
    holding the exclusive `flock` on PATH/.trainlab.lock, which names this process for the next caller.
    Another holder → one line naming its pid. Release with `unlock_folder`; the kernel drops it if the
    process dies."""
    fd = _try_lock(path / LOCK_NAME)
    if fd is None:
        raise UserError(
            f"{path}: in use by another {what} ({_holder(path / LOCK_NAME)}); "
            f"wait for it to finish or choose another {flag}"
        )
    try:
        with write_errors(path / LOCK_NAME):
            os.ftruncate(fd, 0)
            os.write(
                fd,
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                        "command": " ".join(["trainlab", *sys.argv[1:]]),
                    }
                ).encode(errors="surrogateescape"),
            )
    except BaseException:
        unlock_folder(path, fd)  # a full disk must not leave the lock behind
        raise
    return fd


def unlock_folder(path: Path, fd: int) -> None:
    try:
        os.unlink(path / LOCK_NAME)  # while still holding it: see _try_lock's inode check
    except FileNotFoundError:
        pass
    os.close(fd)


def check_run_dir(
    path: str | Path, *, resume: bool = False, overwrite: bool = False, flag: str = "--out", resumable: bool = True
) -> None:
    """The checks of `RunDir.claim` without taking the lock: for a parent before it launches workers."""
    path = Path(path)
    refusal = _refusal(path, resume, overwrite, flag, resumable)
    if refusal:
        raise ConfigError(refusal)
    lock_path = path / LOCK_NAME
    if lock_path.exists() or lock_path.is_symlink():
        fd = _try_lock(lock_path)
        if fd is None:
            raise UserError(
                f"{path}: in use by another trainlab run ({_holder(lock_path)}); "
                f"wait for it to finish or choose another {flag}"
            )
        os.close(fd)


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock_fd: int | None = None
        self._created: list[Path] = []  # directories this run created, deepest first
        self._clear_pending = False
        self._appended: set[str] = set()  # files `append_metric` already recorded in the manifest

    @classmethod
    def claim(
        cls,
        path: str | Path,
        *,
        resume: bool = False,
        overwrite: bool = False,
        flag: str = "--out",
        resumable: bool = True,
    ) -> RunDir:
        """Own `path` for a run (see the module docstring); release with `release()` or a `with` block.
        `resumable`: whether the command has --resume (the refusal says so)."""
        run = cls(path)
        path = run.path
        refusal = _refusal(path, resume, overwrite, flag, resumable)
        if refusal:
            raise ConfigError(refusal)
        missing = path
        while not missing.exists():
            run._created.append(missing)
            missing = missing.parent
        path.mkdir(parents=True, exist_ok=True)
        run._lock_fd = lock_folder(path, flag)
        vet_folder(path)  # its files are this run's to write (checked above)
        run._clear_pending = overwrite and not resume and bool(_entries(path))
        return run

    def release(self, failed: bool = False) -> None:
        """Give the directory up. After a failed start that wrote nothing, remove what `claim` created."""
        if self._lock_fd is None:
            return
        unlock_folder(self.path, self._lock_fd)
        self._lock_fd = None
        vet_folder(self.path, on=False)
        if failed:
            for d in self._created:
                try:
                    d.rmdir()  # only if empty: a run that wrote something keeps it
                except OSError:
                    break

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        self.release(failed=exc_type is not None)

    def _start_writing(self) -> None:
        """--overwrite: the old run's files go now, at this run's first write, not at claim time."""
        if not self._clear_pending:
            return
        self._clear_pending = False
        owned = _owned(self.path)
        for name in _entries(self.path):  # claim refused any other entry; one appearing since stays
            p = self.path / name
            if name in owned or (name.startswith(".") and name.endswith(".tmp")):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint.pt"

    def write_text(self, name: str, text: str) -> Path:
        self._start_writing()
        return atomic_write_text(self.path / name, text)

    def write_json(self, name: str, obj: Any) -> Path:
        self._start_writing()
        return atomic_write_json(self.path / name, obj)

    def read_json(self, name: str) -> Any:
        return read_json(self.path / name)

    def write_metrics(self, records: list[dict]) -> Path:
        """Rewrites metrics.jsonl whole, atomically: a resumed run never holds records past its checkpoint."""
        self._start_writing()
        return atomic_write_text(self.path / "metrics.jsonl", "".join(to_json(r) + "\n" for r in records))

    def append_metric(self, record: dict) -> None:
        """One more metrics.jsonl line, for runs that log per step (a lost tail costs only those steps)."""
        self._start_writing()
        line = to_json(record) + "\n"
        with write_errors(self.path / "metrics.jsonl"), open(self.path / "metrics.jsonl", "a") as f:
            f.write(line)
        if "metrics.jsonl" not in self._appended:
            record_written(self.path / "metrics.jsonl")
            self._appended.add("metrics.jsonl")

    def read_metrics(self) -> list[dict]:
        from trainlab.io import read_jsonl
        from trainlab.schema import DictOf

        p = self.path / "metrics.jsonl"
        if not p.exists():
            return []
        return read_jsonl(p, DictOf())
