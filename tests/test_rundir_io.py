"""The mechanisms under the hostile-input table: run-directory ownership, atomic writes that respect
the umask, JSON without NaN, output-path checks, declared flag checks."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import re
import stat
import threading

import pytest

from trainlab.errors import ConfigError, UserError
from trainlab.flags import Config, at_least, between, one_of, opt, output_dir
from trainlab.io import (
    FORCE_ENV,
    MANIFEST,
    atomic_write_json,
    atomic_write_text,
    output_problem,
    owned_files,
    read_json,
    refuse_foreign,
    set_force,
    to_json,
)
from trainlab.telemetry.rundir import LOCK_NAME, RunDir, check_run_dir, lock_folder
from trainlab.text import shown

# ----------------------------------------------------------------------------- ownership


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    with RunDir.claim(tmp_path / "run") as run:
        run.write_json("config.json", {"a": 1})
        holder = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(UserError, match=rf"run: in use by another trainlab run \(pid {os.getpid()} on "):
            RunDir.claim(tmp_path / "run", resume=True)
        with pytest.raises(UserError, match="in use by another trainlab run"):
            check_run_dir(tmp_path / "run", resume=True)
    assert not (tmp_path / "run" / LOCK_NAME).exists()  # released: nothing left behind but the run
    RunDir.claim(tmp_path / "run", resume=True).release()  # and free again


def _hold_then_die(path, ready):
    RunDir.claim(path)
    ready.set()
    os._exit(0)  # no release: like kill -9, the kernel drops the lock with the process


def test_a_lock_dies_with_its_process(tmp_path):
    ready = mp.get_context("fork").Event()
    p = mp.get_context("fork").Process(target=_hold_then_die, args=(tmp_path / "run", ready))
    p.start()
    p.join(30)
    assert ready.is_set() and (tmp_path / "run" / LOCK_NAME).exists()  # a stale lock file…
    RunDir.claim(tmp_path / "run", resume=True).release()  # …does not block the next run


def test_reuse_needs_resume_or_overwrite_and_overwrite_clears_at_first_write(tmp_path):
    path = tmp_path / "run"
    with RunDir.claim(path) as run:
        run.write_json("config.json", {"old": True})
        run.write_json("summary.json", {"old": True})
    with pytest.raises(ConfigError, match="already holds a run .*--resume .* --overwrite"):
        RunDir.claim(path)
    with pytest.raises(ConfigError, match="pass --overwrite to replace it"):  # a command without --resume
        RunDir.claim(path, resumable=False)
    run = RunDir.claim(path, overwrite=True)
    assert (path / "summary.json").exists()  # nothing deleted until this run writes
    run.write_json("config.json", {"new": True})
    assert sorted(p.name for p in path.iterdir()) == [MANIFEST, LOCK_NAME, "config.json"]
    run.release()
    assert json.loads((path / "config.json").read_text()) == {"new": True}


def test_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "thesis.tex").write_text("years of work")
    with pytest.raises(ConfigError, match=r"not a trainlab run directory \(it holds thesis.tex\)"):
        RunDir.claim(tmp_path / "docs", overwrite=True)
    assert (tmp_path / "docs" / "thesis.tex").read_text() == "years of work"


def test_overwrite_deletes_only_what_trainlab_wrote_and_refuses_a_run_with_user_files(tmp_path):
    path = tmp_path / "run"
    with RunDir.claim(path) as run:
        run.write_json("config.json", {"old": True})
    (path / "notes.txt").write_text("mine")
    (path / "src").mkdir()
    (path / "src" / "model.py").write_text("mine too")
    with pytest.raises(ConfigError, match=r"holds files trainlab did not write \(notes.txt, src\)"):
        RunDir.claim(path, overwrite=True)
    assert (path / "notes.txt").read_text() == "mine" and (path / "src" / "model.py").exists()
    # a run written before manifests existed: its own file names are what --overwrite may delete
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text("{}")
    (legacy / "events.out.tfevents.1.host").write_text("")
    with RunDir.claim(legacy, overwrite=True) as run:
        run.write_json("summary.json", {})
    assert sorted(p.name for p in legacy.iterdir()) == [MANIFEST, "summary.json"]
    assert owned_files(legacy) == {"summary.json"}


def test_writers_refuse_a_file_trainlab_did_not_write_unless_forced(tmp_path, monkeypatch):
    monkeypatch.delenv(FORCE_ENV, raising=False)
    mine = tmp_path / "index.html"
    mine.write_text("the user's page")
    with pytest.raises(UserError, match="index.html: already exists and trainlab did not write it"):
        atomic_write_text(mine, "report")
    with pytest.raises(
        ConfigError, match=r"-o: \S+index.html already exists and trainlab did not write it; pass --force"
    ):
        refuse_foreign([mine], "-o")
    assert mine.read_text() == "the user's page"
    atomic_write_text(tmp_path / "report.md", "one")  # trainlab's own file: rewritten freely
    atomic_write_text(tmp_path / "report.md", "two")
    assert (tmp_path / "report.md").read_text() == "two"
    set_force(True)
    try:
        atomic_write_text(mine, "report")
    finally:
        set_force(False)
    assert mine.read_text() == "report" and "index.html" in owned_files(tmp_path)


def test_special_files_are_refused_not_read(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match=r"pipe.json: is a FIFO \(named pipe\), expected a regular file"):
        read_json(fifo)  # opening it would block until a writer came
    with pytest.raises(UserError, match="is a character device"):
        atomic_write_text("/dev/null", "x")  # os.replace would swap /dev/null for a plain file
    assert output_problem("/dev/null") == "is a character device, expected a regular file"


def test_a_failed_start_removes_only_what_it_created(tmp_path):
    with pytest.raises(RuntimeError):
        with RunDir.claim(tmp_path / "a" / "b" / "run"):
            raise RuntimeError("data not found")
    assert not (tmp_path / "a").exists()
    (tmp_path / "mine").mkdir()
    with pytest.raises(RuntimeError):
        with RunDir.claim(tmp_path / "mine"):
            raise RuntimeError("bad flag")
    assert (tmp_path / "mine").is_dir()  # it was the user's: kept
    with pytest.raises(RuntimeError):
        with RunDir.claim(tmp_path / "wrote") as run:
            run.write_json("config.json", {})
            raise RuntimeError("crashed in epoch 1")
    assert (tmp_path / "wrote" / "config.json").exists()  # a run that wrote something keeps it


# ----------------------------------------------------------------------------- io


def test_atomic_writes_respect_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        p = atomic_write_text(tmp_path / "a.txt", "x")
        assert stat.S_IMODE(p.stat().st_mode) == 0o640
        os.umask(0o002)
        p = atomic_write_json(tmp_path / "b.json", {"x": 1})
        assert stat.S_IMODE(p.stat().st_mode) == 0o664
    finally:
        os.umask(old)


def test_json_has_no_nan_and_says_where_one_was(tmp_path):
    with pytest.raises(ValueError, match=r"refusing to write nan at \$\['epochs'\]\[1\]\['loss'\]"):
        atomic_write_json(tmp_path / "s.json", {"epochs": [{"loss": 1.0}, {"loss": math.nan}]})
    assert not (tmp_path / "s.json").exists() and not list(tmp_path.iterdir())  # no temp file left either
    assert to_json({"x": None}) == '{"x": null}'


def test_output_problems_are_named_before_work(tmp_path):
    (tmp_path / "f").write_text("")
    assert output_problem(tmp_path / "f", "dir") == "is a file, expected a directory"
    assert output_problem(tmp_path, "file") == "is a directory, expected a file"
    assert (
        output_problem(tmp_path / "f" / "x" / "y.json", "file")
        == f"cannot be created: {tmp_path / 'f'} is a file, not a directory"
    )
    assert output_problem(tmp_path / "new" / "deeper", "dir") is None
    (tmp_path / "ro").mkdir(mode=0o555)
    if not os.access(tmp_path / "ro", os.W_OK):  # root with CAP_DAC_OVERRIDE writes anywhere: nothing to refuse
        assert output_problem(tmp_path / "ro" / "x", "dir").endswith("is not writable (permission denied)")


# ----------------------------------------------------------------------------- declared checks


def test_declared_checks_name_the_flag():
    from dataclasses import dataclass

    @dataclass
    class C(Config):
        rate: float = opt(1.0, "a rate", check=between(0, 1, lo_open=True))
        count: int = opt(1, "a count", check=at_least(1))
        mode: str = opt("a", "a mode", check=one_of(("a", "b")))
        out: str | None = opt(None, "where", check=output_dir)
        hidden: int = opt(3, "set by the program", cli=False, check=at_least(0))

    C().validate()
    for kw, msg in [
        (dict(rate=0.0), "--rate 0: expected a finite number > 0 and <= 1"),
        (dict(rate=math.nan), "--rate nan: expected a finite number > 0 and <= 1"),
        (dict(rate=math.inf), "--rate inf: expected a finite number > 0 and <= 1"),
        (dict(count=0), "--count 0: expected an integer >= 1"),
        (dict(count=True), "--count True: expected an integer >= 1"),
        (dict(mode="c"), "--mode 'c': expected one of a, b"),
        (dict(out="/proc/version"), "--out '/proc/version': is a file, expected a directory"),
        (dict(hidden=-1), "hidden -1: expected an integer >= 0"),
    ]:
        with pytest.raises(ConfigError) as e:
            C(**kw).validate()
        assert str(e.value) == msg


# ----------------------------------------------------------------------------- control files (issue 39)


def _control_cases(folder, name: str, target):
    """`name` in `folder` as each thing it must never be: a link to the user's file, a FIFO, a folder,
    a hard link to the user's file."""
    yield "link", lambda: (folder / name).symlink_to(target), "is a symbolic link"
    yield "fifo", lambda: os.mkfifo(folder / name), r"is a FIFO \(named pipe\)"
    yield "dir", lambda: (folder / name).mkdir(), "is a directory"
    yield "hardlink", lambda: os.link(target, folder / name), r"has 2 names \(a hard link to another file\)"


@pytest.mark.parametrize("kind", ["link", "fifo", "dir", "hardlink"])
def test_a_lock_that_is_not_trainlabs_file_is_refused_naming_it(tmp_path, kind):
    user = tmp_path / "notes.txt"
    user.write_text("the user's notes\n")
    folder = tmp_path / "run"
    folder.mkdir()
    make, reason = {k: (m, r) for k, m, r in _control_cases(folder, LOCK_NAME, user)}[kind]
    make()
    with pytest.raises(UserError, match=rf"{LOCK_NAME}: {reason}, not trainlab's own control file"):
        RunDir.claim(folder)  # a folder holding only a lock link is not empty, and never taken
    assert user.read_text() == "the user's notes\n"
    if kind == "link":
        with pytest.raises(UserError, match="is a symbolic link"):
            lock_folder(folder)  # the lab's and gpt bench's lock: the same open


@pytest.mark.parametrize("kind", ["link", "fifo", "dir", "hardlink"])
def test_a_manifest_that_is_not_trainlabs_file_is_refused_naming_it(tmp_path, kind):
    user = tmp_path / "notes.txt"
    user.write_text("results.json\n")  # its lines must never be taken as files trainlab owns
    folder = tmp_path / "out"
    folder.mkdir()
    make, reason = {k: (m, r) for k, m, r in _control_cases(folder, MANIFEST, user)}[kind]
    make()
    result: list = []

    def write():
        try:
            atomic_write_json(folder / "results.json", {"a": 1})
        except BaseException as e:
            result.append(e)

    t = threading.Thread(target=write, daemon=True)  # a FIFO must not hang it
    t.start()
    t.join(20)
    assert not t.is_alive(), "writing beside a FIFO manifest hung"
    assert result and isinstance(result[0], UserError), result
    assert re.search(rf"{MANIFEST}: {reason}, not trainlab's own control file", str(result[0])), result[0]
    assert user.read_text() == "results.json\n"
    assert not (folder / "results.json").exists()


def test_the_holders_command_is_shown_through_the_text_gate(tmp_path):
    folder = tmp_path / "run"
    with RunDir.claim(folder):
        lock = folder / LOCK_NAME
        info = json.loads(lock.read_text())
        info["command"] = "trainlab train\n\x1b]0;owned\x07\x1b[2J"
        fd = os.open(lock, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, json.dumps(info).encode())
        os.close(fd)
        with pytest.raises(UserError) as e:
            RunDir.claim(folder, resume=True)
    assert "\x1b" not in str(e.value) and "\n" not in str(e.value)
    assert r"trainlab train\n\x1b]0;owned\x07\x1b[2J" in str(e.value)


# ----------------------------------------------------------------------------- the text gate, the JSON reader


def test_the_text_gate_escapes_controls_and_lone_surrogates():
    assert shown("run\x1b]0;x\x07\x1b[2J\n\udc80\u202eok") == r"run\x1b]0;x\x07\x1b[2J\n\udc80\u202eok"
    assert shown("été ünïcode 😀 tabs\tkept", lines=True) == "été ünïcode 😀 tabs\tkept"
    assert UserError("a\x1b[2Jb").args[0] == r"a\x1b[2Jb"  # every error line passes it


def test_the_json_reader_refuses_lone_surrogates(tmp_path):
    p = tmp_path / "summary.json"
    p.write_text('{"device_name": "cpu", "runs": [{"name": "ok\\udc80"}]}')
    with pytest.raises(UserError, match=r"summary.json: 'runs'\[0\]\['name'\] holds a lone surrogate \(ok\\udc80\)"):
        read_json(p)
    p.write_text('{"name": "\\ud83d\\ude00"}')  # a pair is a character (😀), not a lone surrogate
    assert read_json(p) == {"name": "😀"}


# ----------------------------------------------------------------------------- one write-error line

_FULL_DISK = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # every write past 4 KiB fails with EFBIG
from trainlab import io
what, path = sys.argv[1], sys.argv[2]
try:
    if what == "torch":
        import torch
        io.atomic_torch_save(path, {"w": torch.zeros(100_000)})
    else:
        io.atomic_write_text(path, "x" * 100_000)
except OSError as e:
    print(repr((e.errno, e.filename)))
"""


@pytest.mark.parametrize("what", ["text", "torch"])
def test_a_failed_write_names_the_file_and_leaves_nothing(tmp_path, what):
    import errno
    import subprocess
    import sys

    target = tmp_path / "checkpoint.pt"
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, what, str(target)], capture_output=True, text=True, timeout=300
    )
    assert proc.stdout.strip() == repr((errno.EFBIG, str(target))), proc.stdout + proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a temporary file or a partial target was left"


def test_a_lock_whose_write_fails_is_released(tmp_path, monkeypatch):
    import errno

    import trainlab.telemetry.rundir as rundir

    def full(*_a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.os, "write", full)
    with pytest.raises(OSError) as e:
        rundir.lock_folder(tmp_path)
    assert e.value.filename == str(tmp_path / LOCK_NAME)
    monkeypatch.undo()
    assert not (tmp_path / LOCK_NAME).exists()
    rundir.unlock_folder(tmp_path, rundir.lock_folder(tmp_path))  # free again


# ----------------------------------------------------------------------------- bounds, caches, launchers


@pytest.mark.parametrize("raw", ["1e300", "inf", "nan", "0", "-5"])
def test_the_process_group_timeout_is_bounded_where_parsed(monkeypatch, raw):
    from trainlab.distributed.launch import TIMEOUT_ENV, dist_timeout_s

    monkeypatch.setenv(TIMEOUT_ENV, raw)
    with pytest.raises(ConfigError, match=rf"\${TIMEOUT_ENV}='{raw}': expected a positive number of seconds"):
        dist_timeout_s()


def test_no_home_and_no_passwd_entry_falls_back_to_a_private_temp_cache(tmp_path, monkeypatch, capsys):
    import pathlib
    import tempfile

    from trainlab import io

    for var in ("TRAINLAB_CACHE", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(var, raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(pathlib.Path, "home", staticmethod(no_home))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(io, "_said_fallback", False)
    root = io.cache_root()
    assert root == tmp_path / f"trainlab-cache-{os.getuid()}" and root.is_dir()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert "no home folder" in capsys.readouterr().err


def test_the_launchers_error_file_is_written_only_inside_its_own_launch(tmp_path, monkeypatch):
    from trainlab.distributed.launch import ERROR_FILE_ENV, LAUNCHER_ENV, launch_folder, record_worker_error

    user = tmp_path / "thesis.txt"
    user.write_text("two years of work\n")
    monkeypatch.setenv(LAUNCHER_ENV, "1")
    monkeypatch.setenv(ERROR_FILE_ENV, str(user))
    assert record_worker_error("trainlab: error: x", 2) is False
    assert user.read_text() == "two years of work\n"
    with launch_folder() as launch:
        monkeypatch.setenv(LAUNCHER_ENV, str(launch))
        assert record_worker_error("trainlab: error: x", 2) is False  # still outside the launch's folder
        monkeypatch.setenv(ERROR_FILE_ENV, str(launch / "agent" / "0" / "error.json"))
        assert record_worker_error("trainlab: error: x", 2) is True
    assert not launch.exists()
    assert user.read_text() == "two years of work\n"


def test_a_stale_torch_build_lock_is_cleared_and_a_held_build_lock_is_waited_on_boundedly(tmp_path, capsys):
    import fcntl

    from trainlab.errors import HardwareError
    from trainlab.ops.build import BUILD_LOCK, TORCH_BATON, build_lock

    (tmp_path / TORCH_BATON).write_text("")  # what Ctrl-C during torch's first build leaves
    with build_lock(tmp_path, "GELU"):
        assert not (tmp_path / TORCH_BATON).exists()
    assert "removed" in capsys.readouterr().err
    fd = os.open(tmp_path / BUILD_LOCK, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another builder, alive
    try:
        (tmp_path / TORCH_BATON).write_text("")
        with pytest.raises(HardwareError, match="is being built by another process"):
            with build_lock(tmp_path, "GELU", wait_s=1):
                pass
        assert (tmp_path / TORCH_BATON).exists(), "a live builder's lock was removed"
    finally:
        os.close(fd)


def test_a_full_disk_under_tensorboard_is_one_error_naming_its_file_and_no_thread_traceback(tmp_path, capfd):
    import errno
    import time

    from trainlab.telemetry.tensorboard import make_writer

    writer = make_writer(tmp_path)
    events = writer.file_writer.event_writer._file_name

    def full(*_a):
        raise OSError(errno.ENOSPC, "No space left on device")

    writer.file_writer.event_writer._async_writer._worker._record_writer.write = full
    writer.add_scalar("loss", 1.0, 1)
    deadline = time.monotonic() + 30
    while writer.file_writer.event_writer._async_writer._worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(OSError) as e:
        writer.add_scalar("loss", 1.0, 2)
        writer.flush()
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(events)
    assert "Traceback" not in capfd.readouterr().err
