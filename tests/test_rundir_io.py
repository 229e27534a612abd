"""The mechanisms under the hostile-input table: run-directory ownership, atomic writes that respect
the umask, JSON without NaN, output-path checks, declared flag checks."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import stat

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
from trainlab.telemetry.rundir import LOCK_NAME, RunDir, check_run_dir

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
