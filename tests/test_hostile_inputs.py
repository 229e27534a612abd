"""Hostile and careless input, command by command: one clear line, the right exit code, nothing lost.

`CASES` is a table: each row runs one command line (in-process, `trainlab.cli.main`) in a fresh
workspace and checks the exit code, the last line of stderr, and that every file the user had is
byte-for-byte unchanged afterwards (and that nothing new appeared, except where a row allows it) —
so a bad flag cannot cost a finished run, and a failed start leaves no empty run directory behind.
A new flag gets a row here. The multi-process cases (a killed or hung rank under the launcher) are
the `dist` tests at the end; `docs/reliability.md` reports the count.

Placeholders in a row's argv: {ws} the workspace, {run} a finished LeNet run (copied in), {file} a
plain file, {dir} a folder with an unrelated file, {idx} an IDX data folder the row's setup damaged,
{ckpt} a checkpoint the row's setup crafted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from data_fixtures import write_idx_dir

from trainlab import cli
from trainlab.data.mnist import IDX_STEMS
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train
from trainlab.results.kinds import plan_record, stamp
from trainlab.telemetry.rundir import RunDir

# ----------------------------------------------------------------------------- the table


@dataclass
class Case:
    id: str
    argv: str  # split on spaces after the placeholders are filled in
    last: str  # regex that stderr's last line must match (re.search)
    code: int = 2
    setup: Callable[[Path], None] | None = None
    creates: tuple[str, ...] = ()  # paths (relative to the workspace) the command may create
    check: Callable[[Path, str], None] | None = None  # extra assertions (workspace, stdout)
    env: dict = field(default_factory=dict)
    needs_non_root: bool = False  # permission cases: root (CAP_DAC_OVERRIDE) reads and writes through any mode bits


def _edit_json(rel: str, edit: Callable[[object], object]) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        p = ws / rel
        p.write_text(json.dumps(edit(json.loads(p.read_text()))))

    return setup


def _set(key, value):
    def edit(d):
        d[key] = value
        return d

    return edit


def _write(rel: str, text: str) -> Callable[[Path], None]:
    return lambda ws: (ws / rel).write_text(text)


class _Evil:
    """Pickles to a call of open(marker, "w"): loading it with weights_only=False creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _ckpt(edit: Callable[[dict, Path], object]) -> Callable[[Path], None]:
    """{ckpt} := the finished run's checkpoint after `edit(ckpt, ws)` (which returns what to save)."""

    def setup(ws: Path) -> None:
        ckpt = torch.load(ws / "run" / "checkpoint.pt", weights_only=True)
        torch.save(edit(ckpt, ws), ws / "crafted.pt")

    return setup


def _crafted_into_run(ws: Path) -> None:
    ckpt = torch.load(ws / "run" / "checkpoint.pt", weights_only=True)
    ckpt["history"] = _Evil(ws / "PWNED")
    torch.save(ckpt, ws / "run" / "checkpoint.pt")


def _no_marker(ws: Path, _out: str) -> None:
    assert not (ws / "PWNED").exists(), "the crafted checkpoint's code ran"


def _idx(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        write_idx_dir(ws / "idx")
        damage(ws / "idx")

    return setup


def _overflowing_dims(folder: Path) -> None:
    # 2^31 · 2^31 · 4 = 2^64 wraps to 0 as an int64, which matched the empty payload before the fix
    (folder / IDX_STEMS["train_images"]).write_bytes(struct.pack(">HBB3I", 0, 8, 3, 2**31, 2**31, 4))


def _dir_instead_of_file(folder: Path) -> None:
    (folder / IDX_STEMS["test_labels"]).unlink()
    (folder / IDX_STEMS["test_labels"]).mkdir()


def _not_launched(out: str) -> None:
    assert "launching" not in out, "workers were launched before the flags were checked"


def _unreadable(folder: Path) -> None:
    (folder / IDX_STEMS["train_labels"]).chmod(0)


def _read_only(ws: Path) -> None:
    (ws / "ro").mkdir()
    (ws / "ro").chmod(0o555)


def _timeout_in_header(ws: Path, out: str) -> None:
    assert re.search(r"dist_timeout\W+7 s \(\$TRAINLAB_DIST_TIMEOUT_S\)", out), out[:3000]


def _no_json_nan(ws: Path, _out: str) -> None:
    refuse = lambda c: pytest.fail(f"a JSON file holds {c}")  # noqa: E731 — NaN, Infinity
    for p in ws.rglob("*.json"):
        json.loads(p.read_text(), parse_constant=refuse)
    for p in ws.rglob("*.jsonl"):
        for line in p.read_text().splitlines():
            json.loads(line, parse_constant=refuse)


def _diverged_lenet(ws: Path, out: str) -> None:
    _no_json_nan(ws, out)
    assert not (ws / "new" / "checkpoint.pt").exists() and not (ws / "new" / "summary.json").exists()


def _gpt_run(ws: Path) -> None:
    """A `gpt bench --out` run directory: its summary is a gpt_bench result, not a training summary."""
    (ws / "runs" / "gpt").mkdir(parents=True)
    (ws / "runs" / "gpt" / "summary.json").write_text(
        json.dumps(
            stamp(
                "gpt_bench",
                {
                    "strategy": "none",
                    "world_size": 1,
                    "tokens_per_s": 123.0,
                    "params": 1000,
                    "step_seconds_median": 0.5,
                    "losses": [6.0, 5.9],
                },
                plan_record("cpu"),
            )
        )
    )
    (ws / "runs" / "gpt" / "config.json").write_text(json.dumps({"model": "tiny"}))


def _runs_folder(ws: Path) -> None:
    _gpt_run(ws)
    shutil.copytree(ws / "run", ws / "runs" / "good")
    shutil.copytree(ws / "run", ws / "runs" / "broken")
    (ws / "runs" / "broken" / "metrics.jsonl").write_text("[1, 2]\n")


def _report_renders_good_and_gpt(ws: Path, out: str) -> None:
    md = (ws / "rep" / "report.md").read_text()
    assert "## Training run: good" in md and "GPT benchmark" in md and "Training run: broken" not in md
    assert "broken/metrics.jsonl:1: expected a JSON object" in md


def _hold_lock(ws: Path) -> None:
    ws.joinpath("busy").mkdir()
    _held.append(RunDir.claim(ws / "busy"))


_held: list[RunDir] = []


# -- round 2: ownership, silent wrong results, limits, one-line errors, failing early ---------------------


def _beside_run(ws: Path) -> None:
    (ws / "run" / "notes.txt").write_text("the user's notes\n")
    (ws / "run" / "src").mkdir()
    (ws / "run" / "src" / "model.py").write_text("the user's code\n")


def _users_file(rel: str) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text("the user's file, not trainlab's\n")

    return setup


def _real_mnist():
    from trainlab.data.mnist import load_mnist

    return load_mnist()


def _shifted_pack(ws: Path) -> None:
    """A pack whose labels are all shifted by one, with checksums recomputed: internally consistent."""
    from trainlab.data.pack import write_pack

    arrays = _real_mnist().as_dict()
    for key in ("train_labels", "test_labels"):
        arrays[key] = ((arrays[key].astype(np.int64) + 1) % 10).astype(np.uint8)
    write_pack(ws / "shifted.npz", arrays, source="someone's edit")


def _altered_idx(ws: Path) -> None:
    from data_fixtures import write_idx_dir

    from trainlab.data.mnist import MNISTArrays

    a = _real_mnist()
    labels = a.test_labels.copy()
    labels[:100] = (labels[:100] + 1) % 10
    write_idx_dir(ws / "idx", MNISTArrays(a.train_images, a.train_labels, a.test_images, labels, source="edited"))


def _says_not_official(which: str) -> Callable[[Path, str], None]:
    def check(ws: Path, out: str) -> None:
        line = next((ln for ln in out.splitlines() if ln.startswith("data: ")), "")
        assert re.search(rf"fingerprint [0-9a-f]{{12}}; NOT the official MNIST: {which}", line), out[-2000:]

    return check


def _both_labels_listed(ws: Path, out: str) -> None:
    assert "lr=0.0010000001" in out and re.search(r"^  lr=0\.001$", out, re.M), out


def _other_settings_sweep(ws: Path) -> None:
    (ws / "sw").mkdir()
    shutil.copytree(ws / "run", ws / "sw" / "run")  # a one-configuration sweep's run folder is OUT/run


def _gzip_idx(declared: tuple[int, ...], payload: int) -> Callable[[Path], None]:
    """train-images as a gzip file whose header declares `declared` but holds `payload` zero bytes."""
    import gzip

    def damage(folder: Path) -> None:
        (folder / IDX_STEMS["train_images"]).unlink()
        header = struct.pack(">HBB", 0, 8, len(declared)) + struct.pack(f">{len(declared)}I", *declared)
        (folder / (IDX_STEMS["train_images"] + ".gz")).write_bytes(gzip.compress(header + bytes(payload)))

    return _idx(damage)


def _npz(ws: Path, name: str, members: dict[str, bytes]) -> None:
    import zipfile

    with zipfile.ZipFile(ws / name, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in members.items():
            zf.writestr(member, data)


def _npy(array, shape=None) -> bytes:
    import io as _io

    buf = _io.BytesIO()
    header = {"descr": array.dtype.str, "fortran_order": False, "shape": shape or array.shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + np.ascontiguousarray(array).tobytes()


def _pack_declaring_huge_array(ws: Path) -> None:
    small = np.zeros((2, 28, 28), np.uint8)
    _npz(
        ws,
        "huge.npz",
        {"manifest.npy": _npy(np.array('{"format": 1}')), "train_images.npy": _npy(small, shape=(10**7, 28, 28))},
    )


def _pack_with_list_manifest(ws: Path) -> None:
    from trainlab.data.pack import KEYS

    arrays = {k: np.zeros((2, 28, 28) if "images" in k else (2,), np.uint8) for k in KEYS}
    np.savez_compressed(ws / "listy.npz", manifest=np.array(json.dumps([1, 2])), **arrays)


def _fifo(rel: str) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        target = ws / rel
        if target.exists():
            target.unlink()
        os.mkfifo(target)

    return setup


def _help_lists(flag: str) -> Callable[[Path, str], None]:
    def check(ws: Path, out: str) -> None:
        assert re.search(rf"^\s+{flag}\b", out, re.M), out[:2000]

    return check


def _raw(rel: str, text: str) -> Callable[[Path], None]:
    return lambda ws: (ws / rel).write_text(text)


# -- round 3: the lab folder is user data too; one JSON reader; every number bounded -------------------------

# Runs no step: _lab's lenet_train is done and lenet_time_to_99 cannot run at tiny (rows whose lab has no
# finished step pass --budget 1s, shorter than any step's estimate)
LAB = "lab --out {ws}/lab --size tiny --device cpu --parts lenet --budget 1m"
LAB_WRITES = ("lab", "lab/*", "lab/*/*", "lab/*/*/*", "lab/*/*/*/*")
HOSTILE_TITLE = "<img src=x onerror=alert(1)> [click](javascript:alert(1)) *bold*"
_OK_STEP = {"status": "ok", "part": "lenet", "title": "LeNet-5", "seconds": 3.0, "estimate_s": 25.0}


def _lab(
    edit: Callable[[dict], object] | None = None,
    steps: dict | None = None,
    raw: str | None = None,
    extra: Callable[[Path], None] | None = None,
) -> Callable[[Path], None]:
    """{ws}/lab: a lab trainlab wrote (results.json in its manifest), at size tiny on the CPU, whose
    lenet steps are done (lenet_time_to_99 cannot run at tiny), so a call runs no step; `edit` damages it."""

    def setup(ws: Path) -> None:
        from trainlab.io import atomic_write_json, atomic_write_text

        (ws / "lab").mkdir()
        state = {
            "version": 1,
            "size": "tiny",
            "hardware": {"kind": "cpu", "gpus": 0, "name": "cpu", "cpus": 2},
            "calls": [],
            "steps": {"lenet_train": dict(_OK_STEP)} if steps is None else steps,
        }
        if raw is not None:
            atomic_write_text(ws / "lab" / "results.json", raw)
        else:
            atomic_write_json(ws / "lab" / "results.json", edit(state) if edit else state)
        if extra:
            extra(ws)

    return setup


class _LabHolder:
    def __init__(self, folder: Path):
        from trainlab.telemetry.rundir import lock_folder

        self.folder, self.fd = folder, lock_folder(folder)

    def release(self) -> None:
        from trainlab.telemetry.rundir import unlock_folder

        unlock_folder(self.folder, self.fd)


def _hold_lab(ws: Path) -> None:
    _held.append(_LabHolder(ws / "lab"))


def _step_links_outside(ws: Path) -> None:
    (ws / "outside").mkdir()
    (ws / "outside" / "private.json").write_text(json.dumps({"rows": [{"secret": "OUTSIDE-SECRET"}]}))
    (ws / "lab" / "steps").mkdir()
    (ws / "lab" / "steps" / "lenet_train").symlink_to(ws / "outside", target_is_directory=True)


def _outside_not_read(ws: Path, _out: str) -> None:
    import tarfile

    md = (ws / "lab" / "report" / "report.md").read_text()
    assert "OUTSIDE-SECRET" not in md and "steps/lenet_train is a link out of the lab folder" in md, md[-2000:]
    with tarfile.open(ws / "lab" / "lab.tar.gz") as tar:
        assert not any("private.json" in m.name for m in tar.getmembers())


def _step_dir_with_log(ws: Path) -> None:
    (ws / "lab" / "steps" / "lenet_train").mkdir(parents=True)
    (ws / "lab" / "steps" / "lenet_train" / "log.txt").write_text("a log\n")


def _members_inside(ws: Path, _out: str) -> None:
    import tarfile

    with tarfile.open(ws / "lab" / "lab.tar.gz") as tar:
        names = tar.getnames()
    assert names and all(not n.startswith("/") and ".." not in Path(n).parts and n.startswith("lab/") for n in names), (
        names
    )


def _thesis(ws: Path) -> None:
    (ws / "lab" / "steps" / "lenet_train").mkdir(parents=True)
    (ws / "lab" / "steps" / "lenet_train" / "thesis.txt").write_text("three years of work\n")


def _cache_link(ws: Path) -> None:
    (ws / "mycache").mkdir()
    (ws / "mycache" / "mnist.npz").write_text("the user's own cache\n")
    (ws / "lab" / "cache").mkdir()
    (ws / "lab" / "cache" / "mnist").symlink_to(ws / "mycache", target_is_directory=True)


def _half_pack(ws: Path) -> None:
    from trainlab.data.pack import KEYS, write_pack

    arrays = {k: np.zeros((2, 28, 28) if "images" in k else (2,), np.uint8) for k in KEYS}
    write_pack(ws / "full.npz", arrays, source="test")
    data = (ws / "full.npz").read_bytes()
    (ws / "half.npz").write_bytes(data[: len(data) // 2])
    (ws / "full.npz").unlink()


def _announced(ws: Path, out: str) -> None:
    assert "lab: --mnist" in out and "NOT the official MNIST" in out, out[-2000:]
    assert "NOT the official MNIST" in (ws / "lab" / "report" / "report.md").read_text()
    assert json.loads((ws / "lab" / "results.json").read_text())["data"]["official"] is False


def _md_escaped(rel: str) -> Callable[[Path, str], None]:
    def check(ws: Path, _out: str) -> None:
        md = re.sub(r"^(`{3,})$.*?^\1$", "", (ws / rel).read_text(), flags=re.S | re.M)  # code blocks show text as is
        assert not re.search(r"(?<!\\)<img|(?<!\\)\]\(javascript", md), md[:3000]  # only escaped: \<img, \](
        shown = (
            "\\<img src=x onerror=alert(1)\\>",
            "&lt;img src=x onerror=alert(1)&gt;",
        )  # Markdown text; a <summary>'s HTML text
        assert any(s in md for s in shown), md[:3000]  # shown, as text

    return check


def _ckpt_in_run(edit: Callable[[dict], dict]) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        ckpt = torch.load(ws / "run" / "checkpoint.pt", weights_only=True)
        torch.save(edit(ckpt), ws / "run" / "checkpoint.pt")

    return setup


def _mirror(make: Callable[[Path], None]) -> Callable[[Path], None]:
    from trainlab.data.fetch import FILES_MD5

    def setup(ws: Path) -> None:
        (ws / "mirror").mkdir()
        for name in FILES_MD5:
            make(ws / "mirror" / name)

    return setup


def _sweep_json_fifo(ws: Path) -> None:
    (ws / "runs").mkdir()
    shutil.copytree(ws / "run", ws / "runs" / "good")
    os.mkfifo(ws / "runs" / "sweep.json")


def _sparse(rel: str, size: int) -> Callable[[Path], None]:
    def setup(ws: Path) -> None:
        with open(ws / rel, "r+b" if (ws / rel).exists() else "wb") as f:
            f.truncate(size)  # a hole: no disk, no memory

    return setup


def _report_says(text: str) -> Callable[[Path, str], None]:
    def check(ws: Path, _out: str) -> None:
        md = (ws / "rep" / "report.md").read_text()
        assert text in md, md[-3000:]

    return check


def _steps_under_the_callers_folder(ws: Path, _out: str) -> None:
    steps = json.loads((ws / "rel_lab" / "results.json").read_text())["steps"]
    # as a student types them in the lab folder: each step's output under steps/NAME, no machine's path
    commands = {n: r["command"] for n, r in steps.items() if "{out}" not in r.get("command", "{out}")}
    assert commands and all(f" steps/{n}" in c and str(ws) not in c for n, c in commands.items()), commands


def _summary_says_not_official(ws: Path, out: str) -> None:
    _says_not_official("train_labels, test_labels differ")(ws, out)
    assert "NOT the official MNIST" in json.loads((ws / "new" / "summary.json").read_text())["data"]


# issue 39: trainlab's control files, the text gate, bounds, the GPT matrices
def _control(rel: str, make: str) -> Callable[[Path], None]:
    """`rel` (a `.trainlab.lock` or `.trainlab-files`) as a link to the user's {file}, a FIFO or a folder."""

    def setup(ws: Path) -> None:
        p = ws / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        {"link": lambda: p.symlink_to(ws / "file"), "fifo": lambda: os.mkfifo(p), "dir": p.mkdir}[make]()

    return setup


NO_GPU = not torch.cuda.is_available()

RUN_ARGS = "--epochs 1 --train-subset 256 --test-subset 100 --batch-size 64 --device cpu --no-progress --no-tensorboard"
NEW = f"train {RUN_ARGS} --out {{ws}}/new"

CASES = [
    # -- train: flags, before any data is loaded ----------------------------------------------------
    Case("train-lr-nan", f"{NEW} --lr nan", r"--lr nan: expected a finite number > 0"),
    Case("train-lr-negative", f"{NEW} --lr -1", r"--lr -1: expected a finite number > 0"),
    Case("train-lr-inf", f"{NEW} --lr inf", r"--lr inf: expected a finite number > 0"),
    Case("train-subset-negative", f"{NEW} --train-subset -10", r"--train-subset -10: expected an integer >= 1"),
    Case("train-subset-zero", f"{NEW} --train-subset 0", r"--train-subset 0: expected an integer >= 1"),
    Case("test-subset-zero", f"{NEW} --test-subset 0", r"--test-subset 0: expected an integer >= 1"),
    Case(
        "label-smoothing-above",
        f"{NEW} --label-smoothing 1.5",
        r"--label-smoothing 1.5: expected a finite number >= 0 and < 1",
    ),
    Case(
        "label-smoothing-one",
        f"{NEW} --label-smoothing 1",
        r"--label-smoothing 1: expected a finite number >= 0 and < 1",
    ),
    Case("eval-batch-size-zero", f"{NEW} --eval-batch-size 0", r"--eval-batch-size 0: expected an integer >= 1"),
    Case("batch-size-zero", f"{NEW} --batch-size 0", r"--batch-size 0: expected an integer >= 1"),
    Case("epochs-zero", f"{NEW} --epochs 0", r"--epochs 0: expected an integer >= 1"),
    Case("weight-decay-nan", f"{NEW} --weight-decay nan", r"--weight-decay nan: expected a finite number >= 0"),
    Case(
        "warmup-negative",
        f"{NEW} --schedule cosine --warmup-epochs -1",
        r"--warmup-epochs -1: expected a finite number >= 0",
    ),
    Case("workers-negative", f"{NEW} --workers -1", r"--workers -1: expected an integer >= 0"),
    Case("holdout-zero", f"{NEW} --holdout 0", r"--holdout 0: expected an integer >= 1"),
    Case(
        "holdout-everything",
        f"{NEW} --holdout 60000",
        r"--holdout 60000: expected fewer than the 60000 training images",
    ),
    Case("warmup-batch-size-zero", f"{NEW} --warmup-batch-size 0", r"--warmup-batch-size 0: expected an integer >= 1"),
    Case(
        "batch-warmup-epochs-zero",
        f"{NEW} --warmup-batch-size 32 --batch-warmup-epochs 0",
        r"--batch-warmup-epochs 0: expected a finite number > 0 and <= 1",
    ),
    Case(
        "batch-warmup-epochs-above-one",
        f"{NEW} --warmup-batch-size 32 --batch-warmup-epochs 1.5",
        r"--batch-warmup-epochs 1.5: expected a finite number > 0 and <= 1",
    ),
    Case(
        "warmup-batch-size-dataloader",
        f"{NEW} --warmup-batch-size 32 --loader dataloader",
        r"--warmup-batch-size 32: the batch-size warm-up needs --loader device, not dataloader",
    ),
    Case("seed-negative", f"{NEW} --seed -1", r"--seed -1: expected an integer >= 0"),
    Case("dist-timeout-zero", f"{NEW} --dist-timeout 0", r"--dist-timeout 0: expected a finite number > 0"),
    Case("optimizer-unknown", f"{NEW} --optimizer lion", r"--optimizer 'lion': expected one of adamw, adam, sgd"),
    Case(
        "optimizer-muon-capitalized",
        f"{NEW} --optimizer Muon",
        r"--optimizer 'Muon': expected one of adamw, adam, sgd, manual-sgd, manual-adamw, muon",
    ),
    Case("rank-devices-one", f"{NEW} --rank-devices cpu", r"--rank-devices 'cpu': expected one device per rank"),
    Case(
        "rank-devices-tpu", f"{NEW} --rank-devices cpu,tpu", r"--rank-devices 'cpu,tpu': expected one device per rank"
    ),
    Case(
        "rank-devices-ddp",
        f"{NEW} --rank-devices cpu,cpu --parallel ddp --nproc 2",
        r"--rank-devices cpu,cpu: a mixed CPU \+ GPU world runs the hand-written all-reduce over gloo",
    ),
    Case(
        "rank-devices-count",
        f"{NEW} --rank-devices cpu,cpu --parallel allreduce --nproc 1",
        r"--rank-devices cpu,cpu: 2 devices for --nproc 1",
    ),
    Case(
        "rank-devices-with-device",
        f"{NEW} --rank-devices cpu,cpu --parallel allreduce --nproc 2",
        r"--rank-devices cpu,cpu with --device cpu: each rank's device comes from --rank-devices",
    ),
    Case("sync-bn-no-batchnorm", f"{NEW} --sync-bn --parallel ddp", r"--sync-bn: --model lenet5 has no BatchNorm"),
    Case(
        "sync-bn-ring",
        f"{NEW} --sync-bn --batchnorm --parallel ring",
        r"--sync-bn with --parallel ring: synchronized BatchNorm needs --parallel ddp or allreduce",
    ),
    Case("sync-bn-single-process", f"{NEW} --sync-bn --batchnorm", r"--sync-bn with --parallel none"),
    Case("histograms-without-tensorboard", f"{NEW} --histograms", r"--histograms: the histograms go to TensorBoard"),
    Case("histograms-with-value", f"{NEW} --histograms=yes", r"--histograms"),
    Case(
        "matmul-precision-unknown",
        f"{NEW} --matmul-precision low",
        r"--matmul-precision 'low': expected one of highest, high, medium",
    ),
    Case(
        "matmul-precision-contradicts-tf32",
        f"{NEW} --tf32 on --matmul-precision highest",
        r"--matmul-precision highest: conflicts with --tf32 on",
    ),
    Case(
        "train-step-mode-unknown",
        f"{NEW} --step-mode turbo",
        r"--step-mode 'turbo': expected one of auto, eager, compile, cudagraph",
    ),
    Case(
        "train-step-mode-empty",
        f"{NEW} --step-mode=",
        r"--step-mode '': expected one of auto, eager, compile, cudagraph",
    ),
    Case(
        "train-step-mode-cudagraph-on-cpu",
        f"{NEW} --step-mode cudagraph",
        r"--step-mode cudagraph: CUDA graphs need a CUDA device, not cpu \(use --step-mode eager or compile\)",
    ),
    Case(
        "train-step-mode-conflicts-with-compile",
        f"{NEW} --compile --step-mode eager",
        r"--step-mode eager: conflicts with --compile",
    ),
    Case("act-unknown", f"{NEW} --act swishy", r"--act 'swishy': expected one of relu"),
    Case("name-escapes", f"train {RUN_ARGS} --name ../escape", r"--name '../escape': expected a plain name"),
    Case("ema-one", f"{NEW} --ema 1", r"--ema 1: expected a finite number >= 0 and < 1"),
    Case("ema-nan", f"{NEW} --ema nan", r"--ema nan: expected a finite number >= 0 and < 1"),
    Case("ema-warmup-zero", f"{NEW} --ema 0.99 --ema-warmup 0", r"--ema-warmup 0: expected an integer >= 1"),
    Case("elastic-alpha-negative", f"{NEW} --elastic-alpha -3", r"--elastic-alpha -3: expected a finite number >= 0"),
    Case("elastic-sigma-zero", f"{NEW} --elastic-sigma 0", r"--elastic-sigma 0: expected a finite number > 0"),
    Case(
        "augment-degrees-above",
        f"{NEW} --augment --augment-degrees 200",
        r"--augment-degrees 200: expected a finite number >= 0 and <= 180",
    ),
    Case(
        "augment-translate-one",
        f"{NEW} --augment --augment-translate 1",
        r"--augment-translate 1: expected a finite number >= 0 and < 1",
    ),
    Case("augment-scale-inf", f"{NEW} --augment --augment-scale inf", r"--augment-scale inf: expected a finite number"),
    Case("augment-p-zero", f"{NEW} --augment --augment-p 0", r"--augment-p 0: expected a finite number > 0 and <= 1"),
    Case(
        "fast-preset-fused-with-gelu",
        f"{NEW} --preset fast --ops fused --act gelu",
        r"--ops fused: the fused first stage is conv → ReLU → pool; it needs --act relu \(got --act gelu\)$",
    ),
    Case(
        "model-unknown",
        f"{NEW} --model vgg16",
        r"--model 'vgg16': expected one of linear, mlp, one-conv, lenet5, lenet5-bn, resnet18",
    ),
    Case(
        "model-resnet-with-batchnorm",
        f"{NEW} --model resnet18 --batchnorm",
        r"--batchnorm is a LeNet-5 option; --model resnet18 has its own BatchNorm",
    ),
    Case("model-mlp-with-own-ops", f"{NEW} --model mlp --ops own", r"--ops own: our operators build LeNet-5 only"),
    Case(
        "model-mlp-with-fused-ops", f"{NEW} --model mlp --ops fused", r"--ops fused: our operators build LeNet-5 only"
    ),
    Case(
        "model-linear-with-avg-pool",
        f"{NEW} --model linear --pool avg",
        r"--pool avg: --model linear has no pooling layer",
    ),
    Case("dataset-unknown", f"{NEW} --dataset cifar10", r"--dataset 'cifar10': expected one of mnist, fashion-mnist"),
    Case(
        "fashion-data-dir-empty",
        f"{NEW} --dataset fashion-mnist --data-dir {{dir}}",
        r"no Fashion-MNIST IDX files here, in raw/ or in FashionMNIST/raw/ .*dataset-fashion-mnist.* or pass --data-dir",
    ),
    Case(
        "fashion-data-dir-is-mnist",
        f"{NEW} --dataset fashion-mnist --data-dir {{idx}}",
        r"train-images-idx3-ubyte: not the Fashion-MNIST train images file \(decompressed md5 [0-9a-f]{32}, expected f4a8712d",
        setup=_idx(lambda folder: None),
    ),
    Case(
        "shard-weights-malformed",
        f"{NEW} --shard-weights 2,x",
        r"--shard-weights '2,x': expected auto or one positive number per rank",
    ),
    Case(
        "shard-weights-zero",
        f"{NEW} --shard-weights 1,0",
        r"--shard-weights '1,0': expected auto or one positive number per rank",
    ),
    Case(
        "shard-weights-single-process",
        f"{NEW} --shard-weights 2,1",
        r"--shard-weights 2,1: splits a global batch across processes; it needs --parallel ddp\|allreduce\|ring with --nproc 2",
    ),
    Case(
        "shard-weights-count",
        f"{NEW} --parallel ddp --nproc 2 --shard-weights 1,1,1",
        r"--shard-weights 1,1,1: 3 weights for 2 ranks",
        check=lambda ws, out: _not_launched(out),
    ),
    Case(
        "shard-weights-starves-a-rank",
        f"{NEW} --parallel ddp --nproc 2 --shard-weights 1000,1",
        r"--shard-weights 1000,1: rank 1 would get no image of a global batch of 64",
        check=lambda ws, out: _not_launched(out),
    ),
    Case("nproc-zero", f"{NEW} --nproc 0", r"--nproc 0: expected an integer >= 1"),
    Case("nproc-without-mode", f"{NEW} --nproc 2", r"--nproc 2 starts 2 processes, which needs --parallel ddp"),
    Case(
        "nproc-bad-flag-caught-in-parent",
        f"{NEW} --nproc 2 --parallel ddp --lr nan",
        r"--lr nan: expected",
        check=lambda ws, out: _not_launched(out),
    ),
    # -- train: the run directory -------------------------------------------------------------------
    Case("out-is-a-file", f"train {RUN_ARGS} --out {{file}}", r"--out \S+file: is a file, expected a directory"),
    Case("out-under-a-file", f"train {RUN_ARGS} --out {{file}}/run", r"cannot be created: \S+file is a file"),
    Case(
        "out-holds-a-run",
        f"train {RUN_ARGS} --out {{run}}",
        r"already holds a run .*--resume \S+ to continue it, --overwrite",
    ),
    Case(
        "out-overwrite-foreign-dir",
        f"train {RUN_ARGS} --out {{dir}} --overwrite",
        r"not a trainlab run directory \(it holds notes.txt\); refusing to replace it",
    ),
    Case(
        "out-in-use",
        f"train {RUN_ARGS} --out {{ws}}/busy",
        rf"busy: in use by another trainlab run \(pid {os.getpid()} ",
        setup=_hold_lock,
        creates=("busy", "busy/.trainlab.lock"),
    ),
    Case(
        "overwrite-keeps-old-run-when-start-fails",
        f"train {RUN_ARGS} --out {{run}} --overwrite --data-dir {{ws}}/nowhere",
        r"nowhere: --data-dir not found",
    ),
    Case(
        "failed-start-leaves-no-dir",
        f"train {RUN_ARGS} --out {{ws}}/a/b/new --data-dir {{idx}}",
        r"train-images-idx3-ubyte: truncated: dims \[2147483648, 2147483648, 4\] need 18446744073709551616",
        setup=_idx(_overflowing_dims),
    ),
    # -- train --resume -----------------------------------------------------------------------------
    Case(
        "resume-changes-lr",
        "train --resume {run} --lr 0.1 --batch-size 64",
        r"--resume \S+: --lr 0.1 \(saved: 0.005\): a resumed run keeps the settings that decide its result",
    ),
    Case(
        "resume-changes-act",
        "train --resume {run} --act gelu --epochs 2",
        r"--act gelu \(saved: relu\): a resumed run keeps",
    ),
    Case(
        "resume-with-overwrite",
        "train --resume {run} --overwrite",
        r"--overwrite with --resume \S+: resuming continues",
    ),
    Case(
        "resume-complete-run",
        "train --resume {run}",
        r"the run has done 1 of 1 epochs and is complete; pass --epochs N",
    ),
    Case("resume-nowhere", "train --resume {ws}/nowhere", r"--resume \S+nowhere: no such run directory"),
    Case(
        "resume-config-wrong-type",
        "train --resume {run}",
        r"config.json: 'epochs' must be an integer, got '3' \(str\)",
        setup=_edit_json("run/config.json", _set("epochs", "3")),
    ),
    Case(
        "resume-config-not-json",
        "train --resume {run}",
        r"config.json: not valid JSON",
        setup=_write("run/config.json", "{epochs: 3"),
    ),
    Case(
        "resume-config-not-object",
        "train --resume {run}",
        r"config.json: expected a JSON object of TrainConfig fields, got list",
        setup=_write("run/config.json", "[1, 2]"),
    ),
    Case(
        "resume-batchnorm-edited",
        "train --resume {run} --epochs 2",
        r"checkpoint.pt: written by a different config than \S+config.json: batchnorm False vs True",
        setup=_edit_json("run/config.json", _set("batchnorm", True)),
    ),
    Case(
        "resume-crafted-checkpoint",
        "train --resume {run} --epochs 2",
        r"checkpoint.pt: refused: it holds Python objects",
        setup=_crafted_into_run,
        check=_no_marker,
    ),
    # -- train: data files ----------------------------------------------------------------------------
    Case(
        "idx-dims-overflow",
        f"{NEW} --data-dir {{idx}}",
        r"truncated: dims \[2147483648, 2147483648, 4\]",
        setup=_idx(_overflowing_dims),
    ),
    Case(
        "idx-directory-instead-of-file",
        f"{NEW} --data-dir {{idx}}",
        r"t10k-labels-idx1-ubyte: is a directory, expected an IDX file",
        setup=_idx(_dir_instead_of_file),
    ),
    Case("data-dir-is-a-file", f"{NEW} --data-dir {{file}}", r"file: --data-dir is not a directory"),
    Case(
        "idx-unreadable",
        f"{NEW} --data-dir {{idx}}",
        r"train-labels-idx1-ubyte: permission denied \(cannot read it\)",
        setup=_idx(_unreadable),
        needs_non_root=True,
    ),
    Case(
        "out-not-writable",
        f"train {RUN_ARGS} --out {{ws}}/ro/run",
        r"cannot be created: \S+ro is not writable",
        setup=_read_only,
        needs_non_root=True,
    ),
    # -- train: the process-group timeout from the environment is reported as set ------------------------
    Case(
        "dist-timeout-from-env",
        f"{NEW}",
        r"^done: test accuracy",
        code=0,
        env={"TRAINLAB_DIST_TIMEOUT_S": "7"},
        creates=("new", "new/*"),
        check=_timeout_in_header,
    ),
    # -- train: divergence ----------------------------------------------------------------------------
    Case(
        "lr-diverges",
        f"{NEW} --lr 1e9",
        r"training diverged: the training loss became nan at step \d+ of epoch 1 \(--lr 1e\+09",
        code=3,
        creates=("new", "new/config.json", "new/env.json", "new/.trainlab-files"),
        check=_diverged_lenet,
    ),
    # -- eval -------------------------------------------------------------------------------------------
    Case(
        "eval-crafted-pickle",
        "eval {ckpt}",
        r"crafted.pt: refused: it holds Python objects besides tensors",
        setup=_ckpt(lambda c, ws: {**c, "history": _Evil(ws / "PWNED")}),
        check=_no_marker,
    ),
    Case(
        "eval-no-model-key",
        "eval {ckpt}",
        r"crafted.pt: damaged checkpoint: entry 'model' is missing",
        setup=_ckpt(lambda c, ws: {k: v for k, v in c.items() if k != "model"}),
    ),
    Case(
        "eval-wrong-shapes",
        "eval {ckpt}",
        r"does not fit this LeNet-5: shape \(checkpoint vs model\): classifier.1.weight \[120, 40\] vs \[120, 400\]",
        setup=_ckpt(lambda c, ws: {**c, "model": {**c["model"], "classifier.1.weight": torch.zeros(120, 40)}}),
    ),
    Case(
        "eval-missing-keys",
        "eval {ckpt}",
        r"does not fit this LeNet-5: missing: classifier.4.weight$",
        setup=_ckpt(lambda c, ws: {**c, "model": {k: v for k, v in c["model"].items() if k != "classifier.4.weight"}}),
    ),
    Case(
        "eval-batchnorm-mismatch",
        "eval {ckpt}",
        r"trained without BatchNorm, the model is built with it",
        setup=_ckpt(lambda c, ws: {**c, "config": {**c["config"], "batchnorm": True}}),
    ),
    Case(
        "eval-bare-state-dict",
        "eval {ckpt}",
        r"not a trainlab LeNet checkpoint .*looks like a bare state_dict",
        setup=_ckpt(lambda c, ws: c["model"]),
    ),
    Case(
        "eval-config-wrong-type",
        "eval {ckpt}",
        r"crafted.pt \[config\]: 'lr' must be a number, got 'fast'",
        setup=_ckpt(lambda c, ws: {**c, "config": {**c["config"], "lr": "fast"}}),
    ),
    Case(
        "eval-ema-not-weights",
        "eval {ckpt}",
        r"crafted.pt: damaged checkpoint: entry 'ema' must hold decay, updates and the averaged weights",
        setup=_ckpt(lambda c, ws: {**c, "ema": {"decay": 0.999, "updates": 3, "model": "weights"}}),
    ),
    Case(
        "eval-ema-wrong-shapes",
        "eval {ckpt}",
        r"does not fit this LeNet-5: shape \(checkpoint vs model\): classifier.1.weight \[120, 40\]",
        setup=_ckpt(
            lambda c, ws: {
                **c,
                "ema": {
                    "decay": 0.999,
                    "updates": 3,
                    "model": {**c["model"], "classifier.1.weight": torch.zeros(120, 40)},
                },
            }
        ),
    ),
    Case("eval-not-a-checkpoint", "eval {file}", r"file: not a readable checkpoint"),
    Case("eval-nowhere", "eval {ws}/nowhere.pt", r"nowhere.pt: checkpoint not found"),
    # -- data ---------------------------------------------------------------------------------------------
    Case(
        "data-verify-overflow",
        "data verify --data-dir {idx}",
        r"truncated: dims \[2147483648",
        setup=_idx(_overflowing_dims),
    ),
    Case(
        "data-verify-dir-as-file",
        "data verify --data-dir {idx}",
        r"is a directory, expected an IDX file",
        setup=_idx(_dir_instead_of_file),
    ),
    Case(
        "data-convert-out-is-file",
        "data convert --data-dir {idx} --out {file}",
        r"--out \S+file': is a file, expected a directory",
        setup=_idx(lambda f: None),
    ),
    # -- gelu ---------------------------------------------------------------------------------------------
    Case("gelu-check-n-negative", "gelu check --n -5", r"--n -5: expected an integer >= 1"),
    Case("gelu-check-impl-unknown", "gelu check --impl nope", r"--impl 'nope': unknown implementation"),
    Case("gelu-bench-budget-negative", "gelu bench --budget -1", r"--budget -1: expected a finite number > 0"),
    Case("gelu-bench-budget-nan", "gelu bench --budget nan", r"--budget nan: expected a finite number > 0"),
    Case("gelu-bench-sizes-too-big", "gelu bench --sizes 1000G", r"--sizes 1000G: the benchmark holds about 8 tensors"),
    Case(
        "gelu-bench-sizes-garbage", "gelu bench --sizes 12X", r"--sizes '12X': expected a number with an optional K/M/G"
    ),
    Case(
        "gelu-bench-dtype",
        "gelu bench --dtype float16",
        r"--dtype 'float16': expected one of float32, bfloat16, float64",
    ),
    Case(
        "gelu-bench-out-is-file", "gelu bench --quick --out {file}", r"--out \S+file': is a file, expected a directory"
    ),
    # -- gpt ------------------------------------------------------------------------------------------------
    Case("gpt-bench-seq-zero", "gpt bench --model tiny --device cpu --seq 0", r"--seq 0: expected an integer >= 2"),
    Case(
        "gpt-bench-steps-zero", "gpt bench --model tiny --device cpu --steps 0", r"--steps 0: expected an integer >= 1"
    ),
    Case("gpt-bench-lr-nan", "gpt bench --model tiny --device cpu --lr nan", r"--lr nan: expected a finite number > 0"),
    Case(
        "gpt-bench-global-batch-zero",
        "gpt bench --model tiny --device cpu --global-batch 0",
        r"--global-batch 0: expected an integer >= 1",
    ),
    Case(
        "gpt-bench-json-is-dir",
        "gpt bench --model tiny --device cpu --json {dir}",
        r"--json \S+dir': is a directory, expected a file",
    ),
    Case(
        "gpt-bench-json-under-file",
        "gpt bench --model tiny --device cpu --json {file}/x.json",
        r"cannot be created: \S+file is a file",
    ),
    Case(
        "gpt-bench-out-holds-lenet-run",
        "gpt bench --model tiny --device cpu --out {run}",
        r"already holds a run .*; pass --overwrite to replace it, or choose another --out",
    ),
    Case(
        "gpt-bench-nproc-bad-flag-in-parent",
        "gpt bench --model tiny --device cpu --nproc 2 --strategy ddp --steps 0",
        r"--steps 0: expected",
        check=lambda ws, out: _not_launched(out),
    ),
    Case(
        "gpt-bench-diverges",
        "gpt bench --model tiny --device cpu --steps 3 --warmup 0 --seq 16 --global-batch 2 "
        "--micro-batch 2 --lr 1e9 --out {ws}/g",
        r"gpt bench: the loss became non-finite \(nan on rank 0\) at step \d",
        code=3,
        creates=("g", "g/config.json", "g/env.json", "g/metrics.jsonl", "g/events.out.tfevents.*", "g/.trainlab-files"),
        check=_no_json_nan,
    ),
    Case(
        "gpt-bench-vocab-multiple-zero",
        "gpt bench --model tiny --device cpu --vocab-multiple 0",
        r"--vocab-multiple 0: expected an integer >= 1",
    ),
    Case(
        "gpt-bench-vocab-multiple-huge",
        "gpt bench --model tiny --device cpu --vocab-multiple 99999",
        r"--vocab-multiple 99999: expected 1 to 1024",
    ),
    Case("gpt-bench-loss-unknown", "gpt bench --model tiny --device cpu --loss fused", r"--loss"),
    Case(
        "gpt-bench-fused-qkv-hf",
        "gpt bench --model tiny --device cpu --impl hf --fused-qkv",
        r"--fused-qkv: a lever of our model, not of --impl hf",
    ),
    Case(
        "gpt-bench-matmul-precision-unknown",
        "gpt bench --model tiny --device cpu --matmul-precision low",
        r"--matmul-precision 'low': expected one of highest, high, medium",
    ),
    Case(
        "gpt-bench-matmul-precision-contradicts-tf32",
        "gpt bench --model tiny --device cpu --tf32 on --matmul-precision highest",
        r"--matmul-precision highest: conflicts with --tf32 on",
    ),
    Case(
        "gpt-compare-matmul-precision-unknown",
        "gpt compare --model tiny --device cpu --matmul-precision fp8 --strategies none --out {dir}/c",
        r"--matmul-precision 'fp8': expected one of highest, high, medium",
    ),
    Case(
        "gpt-compare-budget-zero",
        "gpt compare --model tiny --device cpu --budget 0 --strategies none --out {dir}/c",
        r"--budget 0: expected a finite number > 0",
    ),
    Case(
        "gpt-compare-budget-nan",
        "gpt compare --model tiny --device cpu --budget nan --strategies none --out {dir}/c",
        r"--budget nan: expected a finite number > 0",
    ),
    Case(
        "gpt-bench-zero1-with-tp",
        "gpt bench --model tiny --device cpu --nproc 4 --strategy zero1+tp",
        r"ZeroRedundancyOptimizer cannot hold tp's DTensor parameters; use zero2\+tp or zero3\+tp",
    ),
    Case(
        "gpt-bench-mesh-without-replica",
        "gpt bench --model tiny --device cpu --nproc 4 --strategy ddp+tp+pp --tp 2 --pp 2",
        r"tp 2 × pp 2 leave no second data-parallel replica for ddp",
    ),
    Case(
        "gpt-bench-residual-16bit-without-amp",
        "gpt bench --model tiny --device cpu --residual-16bit",
        r"--residual-16bit: needs amp \(autocast's 16-bit dtype\); --strategy none has none",
    ),
    Case(
        "gpt-bench-fused-boundary-zero3",
        "gpt bench --model tiny --device cpu --nproc 2 --micro-batch 4 --strategy zero3 --fused-boundary",
        r"--fused-boundary: single device or ddp only, not --strategy zero3",
    ),
    Case(
        "gpt-bench-cast-once-hf",
        "gpt bench --model tiny --device cpu --impl hf --strategy amp --cast-once",
        r"--cast-once: a lever of our model, not of --impl hf",
    ),
    Case("gpt-plan-loss-unknown", "gpt plan --model tiny --loss fused", r"--loss"),
    Case(
        "gpt-bench-attention-bad",
        "gpt bench --model tiny --device cpu --attention pad50",
        r"--attention 'pad50': expected auto, plain or padN with N a multiple of 8",
    ),
    Case(
        "gpt-bench-fp8-on-cpu",
        "gpt bench --model tiny --device cpu --strategy amp+compile --fp8",
        r"--fp8: (torchao is not importable|FP8 tensor cores need --device cuda)",
    ),
    Case(
        "gpt-profile-steps-zero",
        "gpt profile --model tiny --device cpu --profile-steps 0",
        r"--profile-steps 0: expected an integer >= 1",
    ),
    Case(
        "gpt-ablation-unknown-change",
        "gpt ablation --model tiny --device cpu --changes tf32,warp",
        r"--changes 'warp': expected some of",
    ),
    Case(
        "gpt-ablation-unknown-group",
        "gpt ablation --model tiny --device cpu --groups nope",
        r"--groups 'nope': expected some of",
    ),
    Case(
        "gpt-plan-vocab-multiple-zero", "gpt plan --vocab-multiple 0", r"--vocab-multiple 0: expected an integer >= 1"
    ),
    Case(
        "gpt-plan-gpu-mem-overflow",
        "gpt plan --gpu-mem 1e400GiB",
        r"--gpu-mem '1e400GiB': expected a size such as 80GiB",
    ),
    Case("gpt-plan-gpu-mem-nan", "gpt plan --gpu-mem nanGiB", r"--gpu-mem 'nanGiB': expected a size"),
    Case("gpt-plan-gpus-zero", "gpt plan --gpus 0", r"--gpus 0: expected an integer >= 1"),
    Case("eval-json-is-dir", "eval {run} --json {dir}", r"--json \S+dir': is a directory, expected a file"),
    Case("profile-json-is-dir", "profile --json {dir}", r"--json \S+dir': is a directory, expected a file"),
    Case("gpt-plan-sm-zero", "gpt plan --sm 0", r"--sm 0: expected one of 70, 72, 75, 80"),
    Case("gpt-plan-json-is-dir", "gpt plan --json {dir}", r"--json \S+dir': is a directory, expected a file"),
    Case("gpt-plan-json-under-file", "gpt plan --json {file}/plan.json", r"cannot be created: \S+file is a file"),
    Case(
        "gpt-compare-timeout-nan",
        "gpt compare --timeout nan --out {ws}/cmp",
        r"--timeout nan: expected a finite number > 0",
    ),
    Case(
        "gpt-compare-timeout-negative",
        "gpt compare --timeout -1 --out {ws}/cmp",
        r"--timeout -1: expected a finite number > 0",
    ),
    Case("gpt-compare-out-is-file", "gpt compare --out {file}", r"--out \S+file': is a file, expected a directory"),
    # -- dp compare ---------------------------------------------------------------------------------------------
    Case("dp-repeats-zero", "dp compare --repeats 0", r"--repeats 0: expected an integer >= 1"),
    Case("dp-threads-zero", "dp compare --threads 0", r"--threads 0: expected an integer >= 1"),
    Case(
        "dp-threads-huge",
        "dp compare --threads 100000",
        r"--threads 100000: expected an integer >= 1 and <= \d+ \(this machine's CPUs\)",
    ),
    Case("dp-nproc-zero", "dp compare --nproc 0", r"--nproc 0: expected an integer >= 1"),
    Case("dp-json-is-dir", "dp compare --json {dir}", r"--json \S+dir': is a directory, expected a file"),
    Case("dp-modes-unknown", "dp compare --modes none,magic", r"--modes: unknown mode 'magic'"),
    Case("dp-timeout-zero", "dp compare --timeout 0", r"--timeout 0: expected a finite number > 0"),
    # -- async -------------------------------------------------------------------------------------------------
    Case("async-device-bogus", "async --device bogus", r"--device 'bogus': expected auto, cpu, cuda or cuda:N"),
    Case("async-ops-zero", "async --ops 0", r"--ops 0: expected an integer >= 1"),
    Case("async-ops-huge", "async --ops 1000000", r"--ops 1000000: expected at most 100000"),
    Case("async-size-huge", "async --size 99999", r"--size 99999: expected at most 8192"),
    Case("async-chain-zero", "async --chain 0", r"--chain 0: expected an integer >= 1"),
    Case("async-steps-zero", "async --steps 0", r"--steps 0: expected an integer >= 1"),
    Case("async-batch-zero", "async --batch-size 0", r"--batch-size 0: expected an integer >= 1"),
    Case("async-copy-mb-huge", "async --copy-mb 100000", r"--copy-mb 100000: expected at most 8192"),
    Case("async-repeats-zero", "async --repeats 0", r"--repeats 0: expected an integer >= 1"),
    Case("async-threads-zero", "async --threads 0", r"--threads 0: expected an integer >= 1"),
    Case("async-json-is-dir", "async --json {dir}", r"--json \S+dir': is a directory, expected a file"),
    Case("async-md-is-dir", "async --md {dir}", r"--md \S+dir': is a directory, expected a file"),
    Case("dp-optimizer-unknown", "dp compare --optimizer manual-lion", r"--optimizer 'manual-lion': expected one of"),
    # -- our operators: train --ops, trainlab ops, trainlab profile -----------------------------------------------
    Case(
        "train-ops-unknown",
        f"{NEW} --ops magic",
        r"--ops 'magic': expected aten, auto, fused, own or own=python\|cpp\|triton\|cuda",
    ),
    Case(
        "train-ops-fused-batchnorm-conv1",
        f"{NEW} --ops fused --batchnorm",
        r"--ops fused: .* no BatchNorm on conv1 \(add --no-batchnorm-conv1\)",
    ),
    Case(
        "train-ops-own-avg-pool",  # --ops fused takes average pooling since issue 40, round 7; our other rungs do not
        f"{NEW} --ops own --pool avg",
        r"--ops own: our pooling operator is max_pool2d; use --pool max",
    ),
    Case("ops-check-batch-zero", "ops check --batch 0", r"--batch 0: expected an integer >= 1"),
    Case("ops-check-out-is-file", "ops check --out {file}", r"--out \S+file': is a file, expected a directory"),
    Case("ops-bench-batch-garbage", "ops bench --batch 2x", r"--batch '2x': expected comma-separated integers"),
    Case("ops-bench-budget-nan", "ops bench --budget nan", r"--budget nan: expected a finite number > 0"),
    Case("ops-bench-threads-zero", "ops bench --threads 0", r"--threads 0: expected an integer >= 1"),
    Case(
        "ops-check-case-unknown",
        "ops check --case lenet-conv9",
        r"--case 'lenet-conv9': choose from none, none-strided, none-0d",
    ),
    Case("ops-check-op-unknown", "ops check --op conv3d", r"--op 'conv3d': unknown operator; choose from gelu, conv2d"),
    Case("ops-check-op-list-unknown", "ops check --op relu,tanh", r"--op 'tanh': unknown operator"),
    Case("ops-bench-op-unknown", "ops bench --op conv3d", r"--op 'conv3d': unknown operator"),
    Case("ops-check-impl-unknown", "ops check --impl fortran", r"--impl 'fortran': unknown implementation"),
    # A check in which every requested row was skipped checked nothing: a failure naming why, never "ok".
    *(
        [
            Case(
                "gelu-check-nothing-runs",
                "gelu check --impl cuda --dtype float32 --approximate none",
                r"nothing was checked: every requested row was skipped \(cuda: no CUDA GPU",
            ),
            Case(
                "ops-check-nothing-runs",
                "ops check --op relu --impl cuda --case nan-inf-zero",
                r"nothing was checked: every requested row was skipped \(cuda: no CUDA GPU",
            ),
        ]
        if not torch.cuda.is_available()
        else []
    ),
    Case("profile-steps-zero", "profile --steps 0 --out {ws}/p", r"--steps 0: expected an integer >= 1"),
    Case("profile-variant-twice", "profile --ops own --ops own --out {ws}/p", r"--ops own own: each variant once"),
    Case("profile-own-act", "profile --ops own --act tanh --out {ws}/p", r"--act must be one of relu, gelu, gelu-tanh"),
    Case(
        "profile-variant-key-unknown",
        "profile --variant a:foo=1 --out {ws}/p",
        r"--variant 'a:foo=1': 'foo=1' is not KEY=VALUE",
    ),
    Case(
        "profile-variant-bad-value",
        "profile --variant a:amp=fp8 --out {ws}/p",
        r"--variant 'a:amp=fp8': --amp 'fp8': expected one of",
    ),
    Case(
        "profile-variant-fused-batchnorm",
        "profile --variant a:ops=fused,batchnorm=true --out {ws}/p",
        r"--variant 'a:ops=fused,batchnorm=true': --ops fused: .*no BatchNorm on conv1",
    ),
    Case(
        "profile-wall-steps-negative",
        "profile --wall-steps -1 --out {ws}/p",
        r"--wall-steps -1: expected an integer >= 0",
    ),
    Case(
        "profile-out-holds-run",
        "profile --steps 1 --warmup 0 --train-subset 64 --batch-size 32 --device cpu --out {run}",
        r"already holds a run .*; pass --overwrite to replace it",
    ),
    # -- sweep -----------------------------------------------------------------------------------------------------
    Case("sweep-seeds-zero", "sweep --seeds 0 --out {ws}/sw", r"--seeds 0: expected an integer >= 1"),
    Case("sweep-lr-not-a-number", "sweep --lr 1e-3,x --out {ws}/sw", r"--lr '1e-3,x': 'x' is not a number"),
    Case(
        "sweep-optimizer-unknown", "sweep --optimizer adam,magic --out {ws}/sw", r"--optimizer 'magic': expected one of"
    ),
    Case("sweep-out-is-file", "sweep --lr 1e-3 --out {file}", r"--out \S+file': is a file, expected a directory"),
    # -- report ------------------------------------------------------------------------------------------------
    Case("report-out-is-file", "report {run} -o {file}", r"-o/--out \S+file': is a file, expected a directory"),
    Case(
        "report-metrics-line-not-object",
        "report {run} -o {ws}/rep",
        r"metrics.jsonl:1: expected a JSON object, found list",
        setup=_write("run/metrics.jsonl", "[1, 2]\n"),
    ),
    Case(
        "report-summary-wrong-type",
        "report {run} -o {ws}/rep",
        r"summary.json: 'test_accuracy' must be a percentage \(0 to 100\), found \"high\"",
        setup=_edit_json("run/summary.json", _set("test_accuracy", "high")),
    ),
    Case(
        "report-config-not-object",
        "report {run} -o {ws}/rep",
        r"config.json: expected a JSON object, found list",
        setup=_write("run/config.json", "[]"),
    ),
    Case(
        "report-folder-skips-bad-renders-gpt",
        "report {ws}/runs -o {ws}/rep",
        r"^report: \S+index.html \(1 runs, 1 result files",
        code=0,
        setup=_runs_folder,
        creates=("rep", "rep/*"),
        check=_report_renders_good_and_gpt,
    ),
    Case("report-nowhere", "report {ws}/nowhere -o {ws}/rep", r"nowhere: no such file or directory"),
    Case(
        "report-pdf-without-chromium",
        "report {run} -o {ws}/rep --pdf",
        r"--pdf: no headless Chromium on PATH \(Debian/Ubuntu: apt-get install chromium\); the HTML report and "
        r"report.md are written",
        env={"PATH": "/nonexistent"},
        creates=("rep", "rep/*"),  # the page and report.md stand; only the PDF is missing
    ),
    Case(
        "report-student-id-too-long",
        "report {run} -o {ws}/rep --student-id " + "9" * 201,
        r"--student-id: expected printable text of 1 to 200 characters",
    ),
    Case(
        "report-lab-results-is-a-link",
        "report {ws}/lab -o {ws}/rep",
        r"lab/results.json: a link; trainlab report reads only the lab folder's own files",
        setup=lambda ws: (
            (ws / "lab").mkdir(),
            (ws / "elsewhere.json").write_text('{"version": 1, "steps": {}, "calls": []}'),
            (ws / "lab" / "results.json").symlink_to(ws / "elsewhere.json"),
        ),
    ),
    Case(
        "report-lab-results-not-a-lab",
        "report {ws}/lab -o {ws}/rep",
        r"lab/results.json: not a trainlab lab's results.json",
        setup=lambda ws: ((ws / "lab").mkdir(), (ws / "lab" / "results.json").write_text('{"steps": []}')),
    ),
    # == round 2 =================================================================================================
    # -- 1: trainlab deletes or replaces only what it wrote ----------------------------------------------------
    Case(
        "overwrite-keeps-user-files-beside-a-run",
        f"train {RUN_ARGS} --out {{run}} --overwrite",
        r"holds files trainlab did not write \(notes.txt, src\); refusing to replace the run",
        setup=_beside_run,
    ),
    Case(
        "report-keeps-users-index",
        "report {run} -o {ws}/site",
        r"-o/--out: \S+site/index.html already exists and trainlab did not write it; pass --force",
        setup=_users_file("site/index.html"),
    ),
    Case(
        "data-pack-keeps-existing-file",
        "data pack {ws}/existing.npz",
        r"data pack OUT '\S+existing.npz': already exists and trainlab did not write it; pass --force",
        setup=_users_file("existing.npz"),
    ),
    Case(
        "data-convert-keeps-users-idx",
        "data convert --out {ws}/conv",
        r"--out: \S+conv/t10k-labels-idx1-ubyte already exists and trainlab did not write it",
        setup=_users_file("conv/t10k-labels-idx1-ubyte"),
    ),
    Case(
        "gpt-bench-json-keeps-users-file",
        "gpt bench --model tiny --device cpu --json {file}",
        r"--json \S+file': already exists and trainlab did not write it; pass --force",
    ),
    Case(
        "dp-compare-md-keeps-users-file",
        "dp compare --md {file}",
        r"--md \S+file': already exists and trainlab did not write",
    ),
    Case(
        "gpt-compare-keeps-users-files",
        "gpt compare --model tiny --device cpu --out {ws}/cmp",
        r"--out: \S+cmp/compare.md already exists and trainlab did not write it",
        setup=_users_file("cmp/compare.md"),
    ),
    Case(
        "json-onto-a-device",
        "gpt bench --model tiny --device cpu --json /dev/null",
        r"--json '/dev/null': is a character device, expected a regular file",
    ),
    # -- 3: no silent wrong result ------------------------------------------------------------------------------
    Case(
        "pack-with-shifted-labels-is-named",
        f"{NEW} --data-dir {{ws}}/shifted.npz",
        r"^done: test accuracy",
        code=0,
        setup=_shifted_pack,
        creates=("new", "new/*"),
        check=_summary_says_not_official,
    ),
    Case(
        "eval-on-altered-idx-is-named",
        "eval {run} --data-dir {ws}/idx",
        r"^per-class accuracy",
        code=0,
        setup=_altered_idx,
        check=_says_not_official("test_labels differs"),
    ),
    Case(
        "sweep-labels-that-round-alike",
        "sweep --lr 0.0010000001,0.001 --dry-run --out {ws}/sw",
        r"^  lr=0.001$",
        code=0,
        check=_both_labels_listed,
    ),
    Case(
        "sweep-folder-holds-other-settings",
        "sweep --lr 0.002 --epochs 1 --train-subset 256 --test-subset 100 "
        "--batch-size 64 --device cpu --no-tensorboard --out {ws}/sw",
        r"sw/run: holds a finished run of other settings \(lr 0.005, this sweep wants 0.002\)",
        setup=_other_settings_sweep,
    ),
    Case(
        "gpt-bench-oom-before-building",
        "gpt bench --model gpt2-1.6b --device cpu --micro-batch 64 --global-batch 64 --seq 1024",
        r"out of memory: needs ≈\d+\.\d GiB, has \d+\.\d GiB free \(cpu, planner estimate\); see `trainlab gpt plan`",
    ),
    # -- 4: limits before allocating or launching ----------------------------------------------------------------
    Case(
        "idx-gzip-declares-more-than-it-holds",
        f"{NEW} --data-dir {{idx}}",
        r"train-images-idx3-ubyte.gz: corrupt or truncated gzip data: dims \[100000, 28, 28\] declare 78400016 bytes, "
        r"more than a \d+-byte gzip file can hold",
        setup=_gzip_idx((100000, 28, 28), 1000),
    ),
    Case(
        "idx-gzip-declares-gigabytes",
        f"{NEW} --data-dir {{idx}}",
        r"dims \[4000000, 28, 28\] declare 3136000000 data bytes, more than the 256 MiB an MNIST-like IDX file may hold",
        setup=_gzip_idx((4000000, 28, 28), 10),
    ),
    Case(
        "pack-declares-a-huge-array",
        f"{NEW} --data-dir {{ws}}/huge.npz",
        r"huge.npz: train_images.npy declares shape \[10000000, 28, 28\] \(7840000000 bytes\)",
        setup=_pack_declaring_huge_array,
    ),
    Case(
        "workers-beyond-the-machine",
        f"{NEW} --loader dataloader --workers 1000000",
        r"--workers 1000000: expected an integer >= 0 and <= \d+ \(4 per CPU core; this machine has \d+\)",
    ),
    Case(
        "nproc-beyond-the-machine",
        f"{NEW} --parallel ddp --nproc 1000",
        r"--nproc 1000: this machine has \d+ CPU core",
        check=lambda ws, out: _not_launched(out),
    ),
    Case(
        "idx-file-is-a-fifo",
        f"{NEW} --data-dir {{idx}}",
        r"train-labels-idx1-ubyte: is a FIFO \(named pipe\), expected a regular file; refusing to read it",
        setup=_idx(lambda folder: _fifo("idx/" + IDX_STEMS["train_labels"])(folder.parent)),
    ),
    Case("checkpoint-is-a-fifo", "eval {ws}/pipe.pt", r"pipe.pt: is a FIFO \(named pipe\)", setup=_fifo("pipe.pt")),
    Case("resume-config-is-a-fifo", "train --resume {run}", r"config.json: is a FIFO", setup=_fifo("run/config.json")),
    # -- 5: one line, never a traceback ----------------------------------------------------------------------------
    Case("train-help", "train --help", r"\S", code=0, check=_help_lists("--preset")),
    Case("sweep-help", "sweep --help", r"\S", code=0, check=_help_lists("--preset")),
    Case(
        "pack-manifest-is-a-list",
        f"{NEW} --data-dir {{ws}}/listy.npz",
        r"listy.npz: the pack's manifest is a JSON list",
        setup=_pack_with_list_manifest,
    ),
    Case(
        "eval-sparse-weights",
        "eval {ckpt}",
        r"crafted.pt: damaged checkpoint: features.0.weight \(torch.sparse_coo\)",
        setup=_ckpt(
            lambda c, ws: {
                **c,
                "model": {**c["model"], "features.0.weight": c["model"]["features.0.weight"].to_sparse()},
            }
        ),
    ),
    Case(
        "seed-huge",
        f"{NEW} --seed 100000000000000000000000",
        r"--seed 100000000000000000000000: expected an integer >= 0 and <= 4294967295",
    ),
    Case(
        "gpt-seed-huge",
        "gpt bench --model tiny --device cpu --seed 99999999999",
        r"--seed 99999999999: expected an integer",
    ),
    Case(
        "report-summary-nan",
        "report {run} -o {ws}/rep",
        r"summary.json: holds NaN, which is not JSON",
        setup=_raw("run/summary.json", '{"test_accuracy": NaN}'),
    ),
    Case(
        "report-metrics-infinity",
        "report {run} -o {ws}/rep",
        r"metrics.jsonl:1: holds Infinity, which is not JSON",
        setup=_raw("run/metrics.jsonl", '{"epoch": 1, "train_loss": Infinity}\n'),
    ),
    Case(
        "report-confusion-mistyped",
        "report {run} -o {ws}/rep",
        r"'confusion_matrix' must be a square list of lists",
        setup=_edit_json("run/summary.json", _set("confusion_matrix", "diagonal")),
    ),
    Case(
        "resume-config-nan",
        "train --resume {run} --epochs 2",
        r"config.json: holds NaN, which is not JSON",
        setup=_raw("run/config.json", '{"lr": NaN}'),
    ),
    # -- 6: fail early, leave nothing behind, name the flag -------------------------------------------------------------
    *(
        [
            Case(
                "act-cuda-on-a-cpu",
                f"{NEW} --act gelu-cuda",
                r"--act gelu-cuda: cannot run on cpu: no CUDA GPU is available .*; choose another --act",
            ),
            Case(
                "ops-cuda-on-a-cpu",
                f"{NEW} --ops own=cuda",
                r"--ops own=cuda: cannot run on cpu: no CUDA GPU is available",
            ),
        ]
        if NO_GPU
        else []
    ),
    Case(
        "unknown-flag-did-you-mean",
        f"{NEW} --lr-rate 3",
        r"train: unrecognized argument --lr-rate \(did you mean --lr\?\)",
    ),
    Case(
        "unknown-nested-flag",
        "gpt bench --stratgy ddp",
        r"gpt bench: unrecognized argument --stratgy \(did you mean --strategy\?\)",
    ),
    # -- lab -------------------------------------------------------------------------------------------------------
    Case(
        "lab-plan-writes-nothing",
        "lab --out {ws}/lab --plan --size tiny --budget 1m",
        r"^estimated: .* of 60\.0 s$",
        code=0,
    ),
    Case(
        "lab-budget-not-a-duration",
        "lab --out {ws}/lab --budget soon",
        r"--budget 'soon': expected a duration such as 25m",
    ),
    Case("lab-budget-zero", "lab --out {ws}/lab --budget 0m", r"--budget '0m': expected more than 0"),
    Case(
        "lab-parts-unknown",
        "lab --out {ws}/lab --parts lenet,resnet",
        r"--parts 'lenet,resnet': expected a comma-separated subset",
    ),
    Case("lab-out-is-file", "lab --out {file} --plan", r"--out \S+file': is a file, expected a directory"),
    Case("lab-device-unknown", "lab --out {ws}/lab --device tpu", r"--device 'tpu': expected auto, cpu or cuda"),
    Case(
        "lab-device-name-runs-nothing",
        "lab --out {ws}/lab --device-name H100",
        r"--device-name: only with --plan",
        env={"CUDA_VISIBLE_DEVICES": ""},
    ),
    Case("lab-gpus-zero", "lab --out {ws}/lab --gpus 0 --plan", r"--gpus 0: expected at least 1"),
    Case(
        "lab-peak-negative",
        "lab --out {ws}/lab --peak-tflops -5 --plan",
        r"--peak-tflops -5.0: expected a positive number",
    ),
    Case("lab-mnist-missing", "lab --out {ws}/lab --mnist {ws}/nope.npz", r"--mnist \S+nope.npz: no such file"),
    Case(
        "lab-results-not-a-lab",
        "lab --out {dir} --plan",
        r"results.json: not a trainlab lab results file",
        setup=lambda ws: (ws / "dir" / "results.json").write_text("[1, 2]"),
    ),
    Case(
        "lab-results-corrupt",
        "lab --out {dir} --plan",
        r"results.json: not valid JSON",
        setup=lambda ws: (ws / "dir" / "results.json").write_text("{not json"),
    ),
    # -- ops bench / gelu check (issue 32): nothing asked for could run; numbers bounded before allocating --
    *(
        [
            Case(
                "ops-bench-nothing-runs-cuda",
                "ops bench --op conv_relu_pool2d --impl cuda --quick --device cpu",
                r"nothing was timed: every requested row was skipped \(cuda: runs on a CUDA GPU",
            )
        ]
        if NO_GPU
        else []
    ),
    Case(
        "ops-bench-layer-not-of-op",
        "ops bench --op conv2d --layer pool1 --quick",
        r"--layer pool1: not a layer of the chosen operators \(conv2d: conv1, conv1\+relu, conv2, conv2\+relu\)",
    ),
    Case(
        "ops-check-bf16-skipped-by-design",
        "ops check --op conv_relu_pool2d --impl python --dtype bfloat16",
        r"nothing was checked: every requested row was skipped \(python: not checked in bfloat16",
    ),
    Case(
        "ops-bench-threads-huge", "ops bench --threads 100000", r"--threads 100000: expected an integer >= 1 and <= \d+"
    ),
    Case(
        "ops-bench-batch-huge",
        "ops bench --batch 100000000",
        r"--batch '100000000': expected batch sizes from 1 to 65,536",
    ),
    Case(
        "gelu-check-n-huge", "gelu check --n 1000000000", r"--n 1000000000: expected an integer >= 1 and <= 16,777,216"
    ),
    # == round 3 ================================================================================================
    # -- 1: one JSON reader with a schema (trainlab.schema): resume of a damaged lab is one line ---------------
    Case(
        "lab-resume-calls-missing",
        LAB,
        r"results.json: 'calls' is missing",
        setup=_lab(lambda st: {k: v for k, v in st.items() if k != "calls"}),
    ),
    Case(
        "lab-resume-calls-a-string",
        LAB,
        r"results.json: 'calls' must be a list \(each an object\), found \"x\"",
        setup=_lab(lambda st: {**st, "calls": "x"}),
    ),
    Case(
        "lab-resume-step-record-a-string",
        LAB,
        r"results.json: 'steps'\['lenet_train'\] must be an object, found \"ok\"",
        setup=_lab(steps={"lenet_train": "ok"}),
    ),
    Case(
        "lab-resume-seconds-not-a-number",
        LAB,
        r"'steps'\['lenet_train'\]\['seconds'\] must be a number, found \"abc\"",
        setup=_lab(steps={"lenet_train": {**_OK_STEP, "seconds": "abc"}}),
    ),
    Case(
        "lab-resume-hardware-a-string",
        LAB,
        r"results.json: 'hardware' must be an object, found \"h100\"",
        setup=_lab(lambda st: {**st, "hardware": "h100"}),
    ),
    Case(
        "lab-resume-list-200k-deep",
        LAB,
        r"results.json: nested deeper than 64 levels",
        setup=_lab(raw="[" * 200_000 + "]" * 200_000),
    ),
    Case(
        "report-summary-200k-deep",
        "report {run} -o {ws}/rep",
        r"summary.json: nested deeper than 64 levels",
        setup=_raw("run/summary.json", '{"test_accuracy": ' + "[" * 200_000 + "]" * 200_000 + "}"),
    ),
    Case(
        "worker-spec-200k-deep",
        "worker {ws}/spec.json",
        r"spec.json: nested deeper than 64 levels",
        setup=_raw("spec.json", "[" * 200_000 + "]" * 200_000),
    ),
    # -- 2: a lab folder is a container --------------------------------------------------------------------------
    Case(
        "lab-second-call-is-refused",
        LAB,
        rf"lab: in use by another trainlab lab \(pid {os.getpid()} ",
        setup=_lab(extra=_hold_lab),
        creates=("lab/.trainlab.lock",),
    ),
    Case(
        "lab-step-link-out-is-not-read",
        LAB,
        r"^lab: 1 of \d+ steps ok",
        code=0,
        setup=_lab(extra=_step_links_outside),
        creates=LAB_WRITES,
        check=_outside_not_read,
    ),
    Case(
        "lab-archive-members-stay-inside",
        "lab --out {ws}/lab/steps/.. --size tiny --device cpu --parts lenet --budget 1m",
        r"^lab: 1 of \d+ steps ok",
        code=0,
        setup=_lab(extra=_step_dir_with_log),
        creates=LAB_WRITES,
        check=_members_inside,
    ),
    Case(
        "lab-keeps-users-file-in-a-step-folder",
        LAB,
        r"nothing was measured: .*steps/lenet_train holds files the lab did not write \(thesis.txt\)",
        setup=_lab(steps={"lenet_train": {"status": "not run", "reason": "budget"}}, extra=_thesis),
        creates=LAB_WRITES,
    ),
    Case(
        "lab-relative-out-is-the-callers-folder",
        "lab --out rel_lab --size tiny --device cpu --parts lenet --budget 1s",
        r"nothing was measured",
        creates=tuple(p.replace("lab", "rel_lab", 1) for p in LAB_WRITES),
        check=_steps_under_the_callers_folder,
    ),
    Case(
        "lab-refuses-a-users-folder",
        "lab --out {dir} --size tiny --device cpu --budget 1m",
        r"--out \S+dir: holds files and is not a trainlab lab \(notes.txt\); give a new or empty folder",
    ),
    Case(
        "lab-cache-link-is-not-written-through",
        LAB,
        r"cache/mnist: is a link \(\S+mycache\); the lab reads MNIST from the user's cache and never writes through",
        setup=_lab(extra=_cache_link),
        creates=LAB_WRITES,
    ),
    # -- 3: every text output escaped for its format -------------------------------------------------------------
    Case(
        "lab-report-md-escapes-step-titles",
        LAB,
        r"^lab: 1 of \d+ steps ok",
        code=0,
        setup=_lab(steps={"lenet_train": {**_OK_STEP, "title": HOSTILE_TITLE}}),
        creates=LAB_WRITES,
        check=_md_escaped("lab/report/report.md"),
    ),
    Case(
        "report-md-escapes-run-values",
        "report {run} -o {ws}/rep",
        r"^report: ",
        code=0,
        creates=("rep", "rep/*"),
        setup=_edit_json("run/summary.json", _set("act", HOSTILE_TITLE)),
        check=_md_escaped("rep/report.md"),
    ),
    # -- 4: every number bounded where it is parsed -------------------------------------------------------------
    Case(
        "profile-threads-beyond-the-machine",
        "profile --threads 100000 --out {ws}/p",
        r"--threads 100000: expected an integer >= 1 and <= \d+ \(this machine's CPUs\)",
    ),
    Case(
        "profile-variant-threads-beyond-the-machine",
        "profile --variant a:threads=100000 --out {ws}/p",
        r"--variant 'a:threads=100000': threads 100000: expected an integer >= 1 and <= \d+",
    ),
    Case(
        "profile-variant-empty-name",
        "profile --variant :amp=bf16 --out {ws}/p",
        r"--variant ':amp=bf16': the name '' is not a plain name",
    ),
    Case(
        "shard-weights-overflow",
        f"{NEW} --parallel ddp --nproc 2 --shard-weights 1e308,1e308",
        r"--shard-weights '1e308,1e308': expected auto or one positive number per rank, e.g. 2,1 \(each finite, > 0 and <= 1e\+06\)",
        check=lambda ws, out: _not_launched(out),
    ),
    Case(
        "slow-ranks-nan",
        f"{NEW} --parallel ddp --nproc 2",
        r"\$TRAINLAB_SLOW_RANKS='1:nan': a factor is a finite number >= 1",
        env={"TRAINLAB_SLOW_RANKS": "1:nan"},
        check=lambda ws, out: _not_launched(out),
    ),
    Case(
        "more-ranks-than-images",
        f"{NEW} --parallel ddp --nproc 2 --train-subset 1",
        r"--train-subset 1: fewer images than the 2 ranks of --nproc 2",
        check=lambda ws, out: _not_launched(out),
    ),
    Case(
        "sweep-seeds-a-billion",
        "sweep --seeds 1000000000 --dry-run --out {ws}/sw",
        r"--seeds 1000000000: expected an integer >= 1 and <= 10,000",
    ),
    Case(
        "sweep-grid-too-large",
        "sweep --seeds 10000 --lr 1e-3,2e-3 --dry-run --out {ws}/sw",
        r"the sweep has 20,000 runs \(2 × 10000\); expected at most 10,000",
    ),
    Case(
        "resume-checkpoint-epochs-negative",
        "train --resume {run} --epochs 2",
        r"checkpoint.pt: damaged checkpoint: epochs_done -5 and global_step",
        setup=_ckpt_in_run(lambda c: {**c, "epochs_done": -5}),
    ),
    Case(
        "resume-checkpoint-global-step-huge",
        "train --resume {run} --epochs 2",
        r"checkpoint.pt: damaged checkpoint: global_step 1000000 after 1 epoch\(s\) of at most \d+ steps",
        setup=_ckpt_in_run(lambda c: {**c, "global_step": 10**6}),
    ),
    Case(
        "eval-checkpoint-epochs-negative",
        "eval {ckpt}",
        r"crafted.pt: damaged checkpoint: epochs_done -5",
        setup=_ckpt(lambda c, ws: {**c, "epochs_done": -5}),
    ),
    Case(
        "report-metrics-1e308",
        "report {run} -o {ws}/rep",
        r"metrics.jsonl:1: 'train_loss' must be a number within ±1e15, found 1e\+308",
        setup=_raw(
            "run/metrics.jsonl",
            '{"epoch": 1, "global_step": 4, "train_loss": 1e308, "test_loss": 1, '
            '"test_accuracy": 50, "images_per_s": 10, "epoch_seconds": 1}\n',
        ),
    ),
    Case(
        "report-summary-minus-1e308",
        "report {run} -o {ws}/rep",
        r"summary.json: 'test_loss' must be a number within ±1e15",
        setup=_edit_json("run/summary.json", _set("test_loss", -1e308)),
    ),
    Case(
        "gpt-plan-gpu-mem-without-unit",
        "gpt plan --gpu-mem 80",
        r"--gpu-mem '80': expected a size with a unit, such as 80GiB",
    ),
    Case("gpt-plan-sm-negative", "gpt plan --sm -1", r"--sm -1: expected one of 70, 72, 75, 80"),
    Case(
        "warmup-batch-size-above-batch-size",
        f"{NEW} --warmup-batch-size 128",
        r"--warmup-batch-size 128: a warm-up starts below --batch-size 64 and grows to it; expected at most 64",
    ),
    Case(
        "data-dir-unknown-user",
        f"{NEW} --data-dir ~nosuchuser/mnist",
        r"--data-dir '~nosuchuser/mnist': ~nosuchuser is not a user of this machine",
    ),
    Case(
        "cache-env-unknown-user",
        f"{NEW}",
        r"\$TRAINLAB_CACHE '~nosuchuser/cache': ~nosuchuser is not a user of this machine",
        env={"TRAINLAB_CACHE": "~nosuchuser/cache"},
    ),
    # -- 5: data trust ------------------------------------------------------------------------------------------
    Case(
        "eval-uses-the-runs-dataset",
        "eval {ckpt}",
        r"no Fashion-MNIST IDX files",
        setup=_ckpt(
            lambda c, ws: {**c, "config": {**c["config"], "dataset": "fashion-mnist", "data_dir": str(ws / "dir")}}
        ),
    ),
    Case(
        "data-fetch-mirror-is-dev-zero",
        "data fetch --mirror file://{ws}/mirror/ --dir {ws}/mn",
        r"download failed from every mirror \(file://\S+: is a character device, expected a regular file",
        setup=_mirror(lambda p: p.symlink_to("/dev/zero")),
    ),
    Case(
        "data-fetch-mirror-is-a-fifo",
        "data fetch --mirror file://{ws}/mirror/ --dir {ws}/mn",
        r"download failed from every mirror \(file://\S+: is a FIFO \(named pipe\)",
        setup=_mirror(os.mkfifo),
    ),
    Case(
        "report-per-class-100k",
        "report {run} -o {ws}/rep",
        r"'per_class_accuracy' must be a list \(each a percentage \(0 to 100\)\) with at most 1,000 items, found 100,000",
        setup=_edit_json("run/summary.json", _set("per_class_accuracy", [50.0] * 100_000)),
    ),
    Case(
        "report-sweep-json-fifo",
        "report {ws}/runs -o {ws}/rep",
        r"^report: \S+index.html \(1 runs",
        code=0,
        setup=_sweep_json_fifo,
        creates=("rep", "rep/*"),
    ),
    Case(
        "report-metrics-a-gibibyte",
        "report {run} -o {ws}/rep",
        r"metrics.jsonl: 1,073,741,824 bytes, more than the 64 MiB a JSON file may hold",
        setup=_sparse("run/metrics.jsonl", 2**30),
    ),
    Case(
        "report-misclassified-malformed",
        "report {run} -o {ws}/rep",
        r"^report: ",
        code=0,
        creates=("rep", "rep/*"),
        setup=_raw("run/misclassified.npz", "PK not a zip"),
        check=_report_says("not a trainlab misclassified.npz"),
    ),
    Case(
        "lab-truncated-mnist-pack",
        "lab --out {ws}/lab --mnist {ws}/half.npz --size tiny --device cpu --budget 1m",
        r"half.npz: ",
        setup=_half_pack,
    ),
    Case(
        "lab-unofficial-mnist-is-announced",
        "lab --out {ws}/lab --mnist {ws}/shifted.npz --size tiny --device cpu --parts lenet --budget 1s",
        r"nothing was measured",
        setup=_shifted_pack,
        creates=LAB_WRITES,
        check=_announced,
    ),
    # -- 6: a command that measured or checked nothing exits non-zero ---------------------------------------------
    Case(
        "report-nothing-to-report", "report {dir} -o {ws}/rep", r"nothing to report: no usable run or trainlab result"
    ),
    # issue 31: hypothetical hardware for --plan, and the amp choices
    Case(
        "lab-sm-not-a-number", "lab --out {ws}/lab --plan --sm sm80", r"--sm 'sm80': expected a compute capability × 10"
    ),
    Case(
        "lab-sm-out-of-range",
        "lab --out {ws}/lab --plan --sm 3",
        r"--sm '3': expected a compute capability × 10 such as 75",
    ),
    Case("lab-sm-nan", "lab --out {ws}/lab --plan --sm nan", r"--sm 'nan': expected a compute capability × 10"),
    Case("lab-sm-inf", "lab --out {ws}/lab --plan --sm inf", r"--sm 'inf': expected a compute capability × 10"),
    Case("lab-sm-runs-nothing", "lab --out {ws}/lab --sm 80", r"--sm: only with --plan"),
    Case(
        "lab-plan-device-name-unknown",
        "lab --out {ws}/lab --plan --device-name B200",
        r"--device-name 'B200': not in trainlab's data-sheet table .*describe it instead with --sm, --gpu-mem",
    ),
    Case(
        "lab-plan-gpu-too-small",
        "lab --out {ws}/lab --plan --sm 75 --gpu-mem 2GiB",
        r"--gpu-mem 2.0 GiB: not even GPT-2 \(124M\) with fp16\+ckpt at micro-batch 1 fits",
    ),
    Case("train-amp-unknown", "train --amp fp8", r"--amp 'fp8': expected one of auto, bf16, fp16, off"),
    # -- issue 39, 1: trainlab's control files are its own regular files or the folder is refused ------------------
    Case(
        "train-lock-is-a-link",
        NEW,
        r"new/\.trainlab\.lock: is a symbolic link, not trainlab's own control file",
        setup=_control("new/.trainlab.lock", "link"),
    ),
    Case(
        "train-lock-is-a-fifo",
        NEW,
        r"new/\.trainlab\.lock: is a FIFO \(named pipe\), not trainlab's own control file",
        setup=_control("new/.trainlab.lock", "fifo"),
    ),
    Case(
        "lab-lock-is-a-link",
        LAB,
        r"lab/\.trainlab\.lock: is a symbolic link, not trainlab's own control file",
        setup=_control("lab/.trainlab.lock", "link"),
    ),
    Case(
        "gpt-bench-lock-is-a-link",
        "gpt bench --model tiny --device cpu --out {ws}/b",
        r"b/\.trainlab\.lock: is a symbolic link, not trainlab's own control file",
        setup=_control("b/.trainlab.lock", "link"),
    ),
    Case(
        "gpt-plan-manifest-is-a-link",
        "gpt plan --json {ws}/o/plan.json",
        r"o/\.trainlab-files: is a symbolic link, not trainlab's own control file",
        setup=_control("o/.trainlab-files", "link"),
    ),
    Case(
        "report-manifest-is-a-fifo",
        "report {run} -o {ws}/rep",
        r"rep/\.trainlab-files: is a FIFO \(named pipe\), not trainlab's own control file",
        setup=_control("rep/.trainlab-files", "fifo"),
    ),
    Case(
        "train-manifest-is-a-folder",
        "train --resume {run} --epochs 2",
        r"run/\.trainlab-files: is a directory, not trainlab's own control file",
        setup=lambda ws: ((ws / "run" / ".trainlab-files").unlink(), (ws / "run" / ".trainlab-files").mkdir()),
    ),
    # -- issue 39, 3: one text gate; the JSON reader refuses lone surrogates --------------------------------------
    Case(
        "error-line-shows-escapes",
        "train --resume {ws}/x\x1b]0;pwn\x07\x1b[2J",
        r"x\\x1b\]0;pwn\\x07\\x1b\[2J: no such run directory",
    ),
    Case(
        "resume-config-lone-surrogate",
        "train --resume {run} --epochs 2",
        r"config\.json: 'name' holds a lone surrogate \(run\\udc80\)",
        setup=_edit_json("run/config.json", _set("name", "run\udc80")),
    ),
    # -- issue 39, 5: bounds where parsed ---------------------------------------------------------------------------
    Case(
        "train-dist-timeout-huge",
        "train --dist-timeout 1e300",
        r"--dist-timeout 1e\+300: expected a finite number > 0 and <= 1e\+09",
    ),
    Case(
        "train-dist-timeout-env-huge",
        "train --parallel ddp --nproc 2 --out {ws}/new",
        r"\$TRAINLAB_DIST_TIMEOUT_S='1e300': expected a positive number of seconds up to 1e\+09",
        env={"TRAINLAB_DIST_TIMEOUT_S": "1e300"},
    ),
    Case(
        "resume-checkpoint-train-seconds-nan",
        "train --resume {run} --epochs 2",
        r"checkpoint\.pt: damaged checkpoint: 'train_seconds' must be a number of seconds from 0 to 1e\+09, found NaN",
        setup=_ckpt_in_run(lambda c: {**c, "train_seconds": float("nan")}),
    ),
    Case(
        "resume-checkpoint-train-seconds-huge",
        "train --resume {run} --epochs 2",
        r"'train_seconds' must be a number of seconds from 0 to 1e\+09, found 1e\+308",
        setup=_ckpt_in_run(lambda c: {**c, "train_seconds": 1e308}),
    ),
    Case(
        "launcher-env-does-not-aim-the-error-file",
        "train --epochs 0",
        r"--epochs 0: expected an integer >= 1",
        env={"TRAINLAB_LAUNCHER": "1", "TORCHELASTIC_ERROR_FILE": "{ws}/file"},
    ),
    # -- issue 39, 6: a GPT matrix that measured nothing exits 2 ----------------------------------------------------
    Case(
        "gpt-ablation-measures-nothing",
        "gpt ablation --model tiny --device cpu --groups separate --out {ws}/abl",
        r"gpt ablation: nothing was measured: no row finished ok",
        creates=("abl", "abl/*"),
    ),
    Case(
        "gpt-compare-every-row-timed-out",
        "gpt compare --model tiny --device cpu --strategies none --timeout 0.01 --out {ws}/cmp",
        r"gpt compare: nothing was measured: no strategy finished ok",
        creates=("cmp", "cmp/*"),
    ),
]


# ----------------------------------------------------------------------------- the harness


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pristine") / "run"
    train(
        TrainConfig(
            epochs=1,
            train_subset=256,
            test_subset=100,
            batch_size=64,
            device="cpu",
            progress=False,
            tensorboard=False,
            gpu_telemetry=False,
            out=str(out),
        ),
        log=lambda *_: None,
    )
    return out


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` → the sha256 of its bytes and its mode (folders: their mode)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        st = p.lstat()
        kind = "dir" if p.is_dir() else _digest(p) if p.is_file() else "special"  # never open a FIFO a row made
        out[rel] = f"{kind} {st.st_mode:o}"
    return out


def _digest(p: Path) -> str:
    """sha256 of the size and the data extents (SEEK_DATA/SEEK_HOLE), read in 1 MiB pieces: a row's 1 GiB
    sparse file is a hole read as nothing, not a gibibyte hashed (and held in memory) per snapshot."""
    try:
        with open(p, "rb") as f:
            fd, h = f.fileno(), hashlib.sha256(str(os.fstat(f.fileno()).st_size).encode())
            end = 0
            while True:
                try:
                    start = os.lseek(fd, end, os.SEEK_DATA)
                except OSError:  # ENXIO: no data after `end`
                    return h.hexdigest()
                end = os.lseek(fd, start, os.SEEK_HOLE)
                f.seek(start)
                h.update(f"@{start}:".encode())
                for _ in range(start, end, 2**20):
                    h.update(f.read(min(2**20, end - f.tell())))
    except PermissionError:  # a row made it unreadable on purpose: its size and mtime stand in
        return f"unreadable {p.stat().st_size} {p.stat().st_mtime_ns}"


def permissions_bind(tmp: Path) -> bool:
    """Whether mode bits stop this process (they do not stop root with CAP_DAC_OVERRIDE)."""
    probe = tmp / ".probe"
    probe.write_text("x")
    probe.chmod(0)
    try:
        probe.read_text()
        return False
    except PermissionError:
        return True
    finally:
        probe.unlink()


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case: Case, finished_run: Path, tmp_path: Path, capsys, monkeypatch):
    if case.needs_non_root and not permissions_bind(tmp_path):
        pytest.skip("runs as root (or with CAP_DAC_OVERRIDE), which reads and writes through any permission bits")
    ws = tmp_path / "ws"
    ws.mkdir()
    for key, value in case.env.items():
        monkeypatch.setenv(key, value.format(ws=ws))
    shutil.copytree(finished_run, ws / "run")
    (ws / "file").write_text("a file where a folder or a checkpoint is expected\n")
    (ws / "dir").mkdir()
    (ws / "dir" / "notes.txt").write_text("not a run\n")
    if case.setup:
        case.setup(ws)
    monkeypatch.chdir(ws)  # anything written to a default place (runs/…) shows up in the snapshot
    before = snapshot(ws)
    argv = case.argv.format(
        ws=ws, run=ws / "run", file=ws / "file", dir=ws / "dir", idx=ws / "idx", ckpt=ws / "crafted.pt"
    ).split()
    try:
        code, out, err = run_cli(argv, capsys)
    finally:
        while _held:
            _held.pop().release()
    lines = (err if case.code else out).strip().splitlines()
    assert lines, f"nothing printed (exit {code}); stdout: {out[-500:]} stderr: {err[-500:]}"
    last = lines[-1]
    assert "Traceback" not in err, err[-3000:]
    if case.code:
        assert last.startswith("trainlab: error: "), err[-2000:]
    assert code == case.code, err[-2000:]
    assert re.search(case.last, last), f"last line: {last}"
    after = snapshot(ws)
    allowed = lambda rel: any(Path(rel).match(pattern) for pattern in case.creates)  # noqa: E731
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and not allowed(k))
    assert not changed, f"the command changed the user's files: {changed}"
    if case.check:
        case.check(ws, out)


def test_the_table_covers_every_command_group():
    groups = {c.argv.split()[0] for c in CASES}
    assert {"train", "eval", "data", "gelu", "gpt", "dp", "report", "lab"} <= groups
    assert len({c.id for c in CASES}) == len(CASES)


# ----------------------------------------------------------------------------- the top-level handler


def _failing_command(exc: BaseException):
    def command(args):
        raise exc

    return command


def test_an_oserror_anywhere_is_one_line_naming_the_path(monkeypatch, capsys):
    import errno

    import trainlab.gpt.cli as gpt_cli

    monkeypatch.setattr(
        gpt_cli, "_plan", _failing_command(OSError(errno.ENOSPC, "No space left on device", "/data/out.json"))
    )
    code, _, err = run_cli(["gpt", "plan"], capsys)
    assert code == 2 and err.strip() == "trainlab: error: /data/out.json: No space left on device"


def test_a_bug_keeps_its_traceback_and_asks_for_a_report(monkeypatch, capsys):
    import trainlab.gpt.cli as gpt_cli

    monkeypatch.setattr(gpt_cli, "_plan", _failing_command(ZeroDivisionError("division by zero")))
    code, _, err = run_cli(["gpt", "plan"], capsys)
    assert code == 1
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError: division by zero" in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("trainlab: internal error (ZeroDivisionError): this is a bug in trainlab")
    )


# ----------------------------------------------------------------------------- the launcher (processes)

_HOOK = """
import os, signal
if os.environ.get("RANK") == "1" and os.environ.get("TRAINLAB_TEST_RANK1"):
    import torch
    step, calls = torch.optim.SGD.step, [0]
    def dying_step(self, *a, **k):
        calls[0] += 1
        if calls[0] == 3:
            os.kill(os.getpid(), getattr(signal, os.environ["TRAINLAB_TEST_RANK1"]))
        return step(self, *a, **k)
    torch.optim.SGD.step = dying_step
"""


def _launch_with_rank1(tmp_path: Path, signame: str, timeout_s: int = 5) -> tuple[subprocess.CompletedProcess, float]:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOOK)  # imported at start-up by every worker (PYTHONPATH)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook), *sys.path]),
        "TRAINLAB_TEST_RANK1": signame,
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "trainlab",
        "train",
        "--parallel",
        "ddp",
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--train-subset",
        "640",
        "--test-subset",
        "100",
        "--batch-size",
        "64",
        "--optimizer",
        "sgd",
        "--lr",
        "0.05",
        "--no-progress",
        "--no-tensorboard",
        "--no-gpu-telemetry",
        "--dist-timeout",
        str(timeout_s),
        "--out",
        str(tmp_path / "run"),
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return proc, time.monotonic() - t0


@pytest.mark.dist
def test_a_killed_rank_is_one_line_naming_rank_and_signal(tmp_path):
    proc, _ = _launch_with_rank1(tmp_path, "SIGKILL")
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == [
        "trainlab: error: rank 1/2 was killed by SIGKILL (signal 9) — often the kernel's out-of-memory "
        "killer; the other ranks were stopped"
    ], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ChildFailedError" not in proc.stderr
    assert (tmp_path / "run" / "config.json").exists()  # the run directory survives, for --resume


@pytest.mark.dist
def test_a_stopped_rank_ends_soon_after_the_timeout(tmp_path):
    # SIGSTOP: the rank cannot even act on SIGTERM; torchrun's agent alone would wait 30 s more for it.
    # The job's wall time is start-up (seconds, more on a loaded box) + 5 s timeout + well under 30 s.
    proc, seconds = _launch_with_rank1(tmp_path, "SIGSTOP", timeout_s=5)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("trainlab: error: rank 0/2: a collective failed") and "the 5 s process-group timeout" in last
    assert last.endswith("[rank(s) 1 did not answer in time and were stopped]"), last
    assert [line for line in proc.stderr.splitlines() if line.startswith("trainlab: error:")] == [last]
    ran = [line for line in proc.stdout.splitlines() if "dist_timeout" in line]
    assert ran and "5 s (--dist-timeout)" in ran[0]
    assert seconds < 120, seconds


# ----------------------------------------------------------------------------- signals (a process)


def test_sigterm_ends_a_run_at_a_checkpoint_that_resume_finishes(tmp_path):
    """SIGTERM mid-epoch: the epoch ends, its checkpoint is written, one line names the signal and the
    --resume command (exit 143); --resume then finishes the run."""
    import signal

    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [
        sys.executable,
        "-m",
        "trainlab",
        "train",
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--train-subset",
        "2048",
        "--test-subset",
        "100",
        "--batch-size",
        "64",
        "--no-progress",
        "--no-tensorboard",
        "--no-gpu-telemetry",
        "--out",
        str(run),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # the data line comes just before the first epoch starts
        if line.startswith("data: "):
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        f"trainlab: error: stopped by SIGTERM after epoch 1 of 2; its checkpoint is "
        f"saved: continue with `trainlab train --resume {run}`"
    ), err[-3000:]
    assert "Traceback" not in err and (run / "checkpoint.pt").exists() and not (run / "summary.json").exists()
    done = subprocess.run(
        [sys.executable, "-m", "trainlab", "train", "--resume", str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2


# ----------------------------------------------------------------------------- kept rows (issue 39)


@pytest.mark.parametrize(
    "damage, says",
    [
        (lambda r: {**r, "tokens_per_s": "fast"}, r"'rows'\[0\]\['tokens_per_s'\] must be a number, found \"fast\""),
        (lambda r: {k: v for k, v in r.items() if k != "total_seconds"}, r"'rows'\[0\]\['total_seconds'\] is missing"),
    ],
)
def test_a_damaged_kept_ablation_row_is_measured_again(tmp_path, capsys, damage, says):
    """A resumed `gpt ablation` keeps only rows that pass the schema; any other is one line and runs again
    (a row with `tokens_per_s: "fast"` was a ValueError, a missing field a KeyError, mid-call)."""
    from trainlab.gpt.ablation import _finished

    good = {
        "status": "ok",
        "bench": "k",
        "tokens": 128,
        "tokens_per_s": 10.0,
        "step_seconds_median": 0.1,
        "step_ms_median": 100.0,
        "total_seconds": 1.0,
    }
    (tmp_path / "ablation.json").write_text(json.dumps({"rows": [damage(good), {**good, "bench": "k2"}]}))
    kept = _finished(str(tmp_path))
    assert list(kept) == ["k2"]
    assert re.search(says, capsys.readouterr().out)
