"""Workers end one way (`launch.end_worker`): a rank that hangs or dies once its work is done costs at
most the process-group timeout, and what was written is kept. One case per multi-process command:
`train --nproc`, `dp compare`, `gpt bench --nproc`, `gpt compare` (`sweep` starts single-process
workers, on GPUs only). Every time bound is measured from the injected event, not from the start:
start-up alone can take a minute on a loaded box.

The rank is made to hang or die by `$TRAINLAB_TEST_END` ("1:hang" / "1:kill", read by `end_worker`),
which writes the event's time to `$TRAINLAB_TEST_END_MARK`. A failure before the results (the mode that
must be marked) comes from a sitecustomize hook, as in test_hostile_inputs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

TIMEOUT_S = 5  # the process-group timeout of these runs: the end barrier waits this long for a peer
BOUND_S = TIMEOUT_S + 60  # event → command back: the timeout, stopping the ranks, and slack for a loaded box
TINY_LENET = ["--epochs", "1", "--device", "cpu", "--train-subset", "256", "--test-subset", "100", "--batch-size", "64"]
TINY_GPT = [
    "--model",
    "tiny",
    "--device",
    "cpu",
    "--steps",
    "2",
    "--warmup",
    "1",
    "--global-batch",
    "4",
    "--seq",
    "32",
    "--micro-batch",
    "2",
]


def _run(
    tmp_path: Path, args: list[str], action: str | None, extra_env: dict | None = None
) -> tuple[subprocess.CompletedProcess, float | None]:
    """`python -m trainlab ARGS` with rank 1 told to `action` at its end; returns the process and the
    seconds from the injected event to the command's return (None when the event did not happen)."""
    mark = tmp_path / "event"
    temp = tmp_path / "temp"  # the launches' temp directory: left empty (issue 37: no torchelastic_* folders)
    temp.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TRAINLAB_DIST_TIMEOUT_S": str(TIMEOUT_S),
        "TMPDIR": str(temp),
        **(extra_env or {}),
    }
    if action:
        env.update(TRAINLAB_TEST_END=f"1:{action}", TRAINLAB_TEST_END_MARK=str(mark))
    proc = subprocess.run(
        [sys.executable, "-m", "trainlab", *args], env=env, capture_output=True, text=True, timeout=600
    )
    ended = time.time()
    left = sorted(p.name for p in temp.iterdir() if p.name.startswith(("torchelastic_", "trainlab-launch-")))
    assert not left, f"launched workers left temp folders: {left}"
    return proc, (ended - float(mark.read_text())) if mark.exists() else None


def _errors(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("trainlab: error:")]


@pytest.mark.parametrize("action", ["hang", "kill"])
def test_train_nproc_keeps_its_run_when_a_rank_hangs_or_dies_at_the_end(tmp_path, action):
    run = tmp_path / "run"
    proc, since = _run(
        tmp_path,
        [
            "train",
            "--parallel",
            "ddp",
            "--nproc",
            "2",
            *TINY_LENET,
            "--no-progress",
            "--no-tensorboard",
            "--no-gpu-telemetry",
            "--dist-timeout",
            str(TIMEOUT_S),
            "--out",
            str(run),
        ],
        action,
    )
    out = proc.stdout + proc.stderr
    assert since is not None and since < BOUND_S, (since, out[-3000:])
    assert proc.returncode == 2, out[-3000:]
    summary = json.loads((run / "summary.json").read_text())  # written before the end: kept
    assert summary["world_size"] == 2 and 0 <= summary["test_accuracy"] <= 100
    errors = _errors(proc)
    assert len(errors) == 1 and "Traceback" not in proc.stderr, out[-3000:]
    if action == "hang":
        assert errors[0].startswith(
            "trainlab: error: rank 0/2: the results are written, but another rank did not reach the end of the run"
        ), errors
        assert f"the {TIMEOUT_S} s process-group timeout" in errors[0]
        assert errors[0].endswith("[rank(s) 1 did not answer in time and were stopped]"), errors
    else:
        assert errors[0].startswith("trainlab: error: rank 1/2 was killed by SIGKILL (signal 9)"), errors


@pytest.mark.slow  # 1-2 minutes each on a loaded 2-core box
def test_dp_compare_keeps_a_mode_whose_rank_hangs_at_the_end(tmp_path):
    out = tmp_path / "cmp.json"
    proc, since = _run(
        tmp_path,
        ["dp", "compare", "--modes", "none,ddp", "--nproc", "2", *TINY_LENET, "--workers", "", "--json", str(out)],
        "hang",
    )
    assert since is not None and since < BOUND_S, (since, proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]  # dp compare writes a stamped record: {kind, schema, plan, rows}
    assert [(r["mode"], r["status"]) for r in rows] == [("none", "ok"), ("ddp", "ok")]
    assert rows[1]["world_size"] == 2 and rows[1]["steps"] == 4 and rows[1]["test_accuracy"] is not None
    assert "note" not in rows[0]
    assert rows[1]["note"].startswith("the results were written, then a rank failed or hung at the end: exit code")


# rank 1 of a multi-process mode dies (SIGKILL) or stops (SIGSTOP) at its 3rd optimizer step: no results
_MIDRUN_HOOK = """
import os, signal, time
if os.environ.get("RANK") == "1" and os.environ.get("TEST_MIDRUN_SIGNAL"):
    import torch
    step, calls = torch.optim.AdamW.step, [0]
    def failing_step(self, *a, **k):
        calls[0] += 1
        if calls[0] == 2:  # early in the epoch: well before any mode can write its results
            with open(os.environ["TRAINLAB_TEST_END_MARK"], "w") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), getattr(signal, os.environ["TEST_MIDRUN_SIGNAL"]))
        return step(self, *a, **k)
    torch.optim.AdamW.step = failing_step
"""


@pytest.mark.slow  # 1-2 minutes each on a loaded 2-core box
@pytest.mark.parametrize("signame, status, limit_s", [("SIGKILL", "failed", 600), ("SIGSTOP", "timeout", 40)])
def test_dp_compare_marks_the_mode_that_did_not_finish_and_keeps_the_others(tmp_path, signame, status, limit_s):
    # SIGSTOP under the default 120 s process-group timeout: only the mode's own --timeout ends it.
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_MIDRUN_HOOK)
    out, md = tmp_path / "cmp.json", tmp_path / "cmp.md"
    env = {
        "PYTHONPATH": os.pathsep.join([str(hook), *sys.path]),
        "TEST_MIDRUN_SIGNAL": signame,
        "TRAINLAB_TEST_END_MARK": str(tmp_path / "event"),
        "TRAINLAB_DIST_TIMEOUT_S": "120" if signame == "SIGSTOP" else str(TIMEOUT_S),
    }
    proc, since = _run(
        tmp_path,
        [
            "dp",
            "compare",
            "--modes",
            "none,ddp",
            "--nproc",
            "2",
            *TINY_LENET,
            "--workers",
            "",
            "--timeout",
            str(limit_s),
            "--json",
            str(out),
            "--md",
            str(md),
        ],
        None,
        env,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    # the last line is the command's (the workers' own output, streamed above it, has the rank's cause)
    assert _errors(proc)[-1] == (
        f"trainlab: error: dp compare: ddp ({status}) did not finish (see the table above); "
        f"the rows that finished are in {out}"
    ), proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["mode"], r["status"]) for r in rows] == [("none", "ok"), ("ddp", status)]
    assert rows[0]["test_accuracy"] is not None and rows[1]["test_accuracy"] is None
    assert f"| ddp | 2 | – | device | **{status}** |" in md.read_text()
    if signame == "SIGSTOP":
        assert rows[1]["error"].startswith(f"the 2-process run wrote no results: stopped at the {limit_s} s limit")
        if since is not None:  # (rank 1 reached its 2nd step before the limit: almost always)
            assert since < limit_s + 30, since


@pytest.mark.slow  # 1-2 minutes each on a loaded 2-core box
def test_gpt_bench_nproc_keeps_its_summary_when_a_rank_dies_at_the_end(tmp_path):
    out = tmp_path / "ddp.json"
    proc, since = _run(
        tmp_path, ["gpt", "bench", *TINY_GPT, "--strategy", "ddp", "--nproc", "2", "--json", str(out)], "kill"
    )
    assert since is not None and since < BOUND_S, (since, proc.stderr[-3000:])
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _errors(proc)[0].startswith("trainlab: error: rank 1/2 was killed by SIGKILL"), proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["world_size"] == 2 and len(summary["losses"]) == 3


@pytest.mark.slow  # 1-2 minutes each on a loaded 2-core box
def test_gpt_compare_keeps_a_strategy_whose_rank_hangs_at_the_end(tmp_path):
    proc, since = _run(
        tmp_path,
        ["gpt", "compare", *TINY_GPT, "--strategies", "none,ddp", "--nproc", "2", "--out", str(tmp_path / "cmp")],
        "hang",
    )
    assert since is not None and since < BOUND_S, (since, proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads((tmp_path / "cmp" / "compare.json").read_text())["rows"]
    assert [(r["strategy"], r["status"]) for r in rows] == [("none", "ok"), ("ddp", "ok")]
    assert rows[1]["note"].startswith("the results were written, then a rank failed or hung at the end")
    assert rows[1]["losses"] == pytest.approx(rows[0]["losses"], abs=1e-5)  # DDP trains the same model


# ----------------------------------------------------------------------------- the launcher's end (issue 39)

_LAUNCHER = """
import sys
from trainlab.distributed.launch import run_limited
from trainlab.signals import RunStopped
child = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(300)"
try:
    run_limited([sys.executable, "-c", child, sys.argv[1]], 600)
except RunStopped as e:
    print(e, file=sys.stderr)
    sys.exit(e.exit_code)
"""


def _gone(pid: int, within_s: float) -> bool:
    """Whether process `pid` ends (or is a zombie nobody reaps) within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def _wait_for(path: Path, within_s: float = 120) -> int:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_launched_child_dies_with_its_launcher(tmp_path, sig):
    pid_file = tmp_path / "child.pid"
    launcher = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER, str(pid_file)], stderr=subprocess.PIPE, text=True, env={**os.environ}
    )
    try:
        child = _wait_for(pid_file)
        launcher.send_signal(sig)
        code = launcher.wait(60)
        assert _gone(child, 15), f"the child {child} runs on after its launcher got {sig.name}"
    finally:
        launcher.kill()
    if sig == signal.SIGTERM:  # handled: the children stopped, one line, 128 + 15
        assert code == 143, launcher.stderr.read()[-2000:]
        assert "stopped by SIGTERM: the running worker processes were stopped" in launcher.stderr.read()


def test_the_workers_of_train_nproc_die_when_the_launcher_is_killed(tmp_path):
    """SIGKILL (no handler runs) to `train --nproc 2`: its workers, started by torch's agent without a
    parent-death signal, armed one themselves (`trainlab worker`)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [*TINY_LENET[:1], "50", *TINY_LENET[2:], "--parallel", "ddp", "--nproc", "2", "--no-progress"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "trainlab", "train", *args, "--no-tensorboard", "--out", str(tmp_path / "run")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, workers = time.monotonic() + 300, []
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.5)
            workers = [
                int(p)
                for p in Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
                if b"worker" in Path(f"/proc/{p}/cmdline").read_bytes()
            ]
        assert len(workers) == 2, "the workers never started"
        time.sleep(3)  # past their start-up, into training
        launcher.kill()
        launcher.wait(30)
        assert all(_gone(w, 30) for w in workers), f"workers {workers} run on after their launcher was killed"
    finally:
        launcher.kill()


# A worker that writes its results on SIGTERM (the graceful stop finishes the epoch): on a loaded box that
# write lands inside the stop's grace period. Seen on CI: a mode stopped at its --timeout counted as ok.
_WRITES_ON_TERM = (
    "import signal, sys, time\n"
    "def term(*_):\n"
    "    open(sys.argv[1], 'w').write('{}')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "if sys.argv[2] == 'early':\n"
    "    open(sys.argv[1], 'w').write('{}')\n"
    "time.sleep(300)\n"
)


@pytest.mark.parametrize("when, kept", [("on-term", False), ("early", True)])
def test_run_limited_keeps_only_results_written_before_its_limit(tmp_path, when, kept):
    from trainlab.distributed.launch import run_limited

    result = tmp_path / "row.json"
    code, _ = run_limited([sys.executable, "-c", _WRITES_ON_TERM, str(result), when], 3, result=result)
    assert code is None  # stopped at the limit either way
    assert result.exists() == kept
