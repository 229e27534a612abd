"""`trainlab lab`: the plan, the budget's hard wall, resuming after SIGKILL, the archive, and the lab on
tiny sizes end to end — killed mid-step, resumed, finished, every step it ran in the report.

The runner tests use stand-in steps (short Python one-liners) so they take seconds; the end-to-end test
runs real steps at `--size tiny` in a subprocess: the LeNet, GELU and own-operator parts, every one of
their steps to the end. Each step's command line is parsed back to its config in test_lab_commands.py,
and the commands themselves have tests of their own."""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from browser import overflow
from test_report_facts import check_lab_report_facts

from trainlab.cli import main
from trainlab.data.mnist import default_cache_dir
from trainlab.hardware import Machine
from trainlab.lab import run as lab_run
from trainlab.lab import steps as lab_steps_mod
from trainlab.lab.steps import PARTS, Command, Step, lab_steps

ROOT = Path(__file__).resolve().parent.parent
CPU = Machine(cpus=2)


def _py(code: str, *args: str) -> Command:
    """A stand-in step's command: Python running `code` (no config: the runner's tests only)."""
    return Command(("python", "-c", code, *args))


def fake_steps(monkeypatch, steps: list[Step]) -> None:
    monkeypatch.setattr(lab_run, "lab_steps", lambda hw, size: steps)
    monkeypatch.setattr(lab_steps_mod, "lab_steps", lambda hw, size: steps)


WRITE = "import json, sys, pathlib; p = pathlib.Path(sys.argv[1]); p.mkdir(parents=True); (p / 'r.json').write_text(json.dumps({'rows': [{'x': 1}]}))"


def test_every_part_has_steps_on_every_hardware_and_size():
    gpu = Machine(1, 90, memory_bytes=80 * 2**30, name="NVIDIA H100 80GB HBM3", peak_tflops=989.0, cpus=16)
    many = Machine(4, 90, memory_bytes=80 * 2**30, name="NVIDIA H100 80GB HBM3", peak_tflops=989.0, cpus=64)
    for hw, size in ((CPU, "tiny"), (CPU, "small"), (gpu, "full"), (many, "full")):
        steps = lab_steps(hw, size)
        assert {s.part for s in steps} == set(PARTS)
        assert [s.name for s in steps][-1] == "gpt_planner_error"  # one 1.6B build, run last (issue 18)
        assert all(s.limit_s >= s.estimate_s for s in steps)
    dp = {s.name: s for s in lab_steps(many, "full")}["dp_compare"]
    assert "dp" in dp.config.modes.split(",") and dp.config.nproc == 4
    cpu_dp = {s.name: s for s in lab_steps(CPU, "small")}["dp_compare"]
    assert cpu_dp.sizes["ranks"] == 2 and cpu_dp.sizes["backend"] == "gloo"
    gpt = {s.name: s for s in lab_steps(gpu, "full")}
    assert gpt["gpt_baseline"].config.model == "gpt2-1.6b" and gpt["gpt_baseline"].config.impl == "hf"
    assert gpt["gpt_baseline"].limit_s >= 300  # the handout's fp32 baseline: the old suite's 150 s cut it off


def test_plan_for_an_h100_from_a_cpu_fits_the_gpu_lease(capsys, tmp_path):
    """The GPU lease (benchmarks/gpu_lease.md): four calls of 9 minutes with the H100-measured estimates
    (issue 29), each resuming the last, hold every step: issue 30's GPT ablation (450 s) takes a call of its
    own. Between the planned calls the test records the planned steps as done, as the calls would."""
    root = tmp_path / "lab"
    planned: list[str] = []
    for parts in ("gpt", "gpt", "lenet,gelu,dp", "ops"):
        assert (
            main(
                [
                    "lab",
                    "--out",
                    str(root),
                    "--plan",
                    "--budget",
                    "9m",
                    "--parts",
                    parts,
                    "--device-name",
                    "NVIDIA H100 80GB HBM3",
                ]
            )
            == 0
        )
        out = capsys.readouterr().out
        assert (
            "NVIDIA H100 80GB HBM3 (cuda, 1 GPU(s), peak 989 TFLOP/s, 80 GiB, 3350 GB/s), size full, budget 540 s"
            in out
        )
        now = [line.split()[0] for line in out.splitlines() if "runs (from" in line]
        assert now, out
        planned += now
        if not root.exists():
            assert parts == "gpt"  # --plan writes nothing: the test plays the finished call
            root.mkdir()
        done = {n: {"status": "ok", "seconds": 1.0} for n in planned}
        (root / "results.json").write_text(json.dumps({"version": 1, "steps": done, "calls": []}))
    assert sorted(planned) == sorted(s.name for s in lab_steps(Machine(1, name="x"), "full"))
    assert planned.index("gpt_plan") == 0  # the scarce part first


def test_the_cpu_hand_in_plans_every_cpu_step_into_one_call(capsys, tmp_path):
    """Issue 37: `--size small` (a CPU's default) runs every step a CPU can in one 25-minute call, LeNet-5 on
    the default recipe (5 epochs: ≥ 99 %, lenet/config.py), the rest not applicable with the reason; the plan
    says what the whole lab needs and in how many calls."""
    assert main(["lab", "--out", str(tmp_path / "lab"), "--plan", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if " runs (from" in line or " not run: " in line}
    steps = lab_steps(CPU, "small")
    assert set(rows) == {s.name for s in steps}
    assert all("runs (from" in rows[s.name] for s in steps if not s.cannot_run), out
    assert {s.name for s in steps if s.cannot_run} == {"lenet_tf32", "gpt_baseline_tf32", "dp_weak", "gpt_offload"}
    assert all("not run: not applicable" in rows[s.name] for s in steps if s.cannot_run)
    assert "size small, budget 1500 s" in out and ", 1 call(s) of 1500 s" in out
    train = {s.name: s for s in steps}["lenet_train"].config
    assert (train.epochs, train.train_subset, train.preset) == (5, None, "default")


def test_calls_needed_packs_steps_as_the_runner_does():
    assert lab_run.calls_needed([], 100) == 0
    assert lab_run.calls_needed([60, 60, 30], 100) == 2  # 60 (+60 waits) +30; then 60
    assert lab_run.calls_needed([100, 1, 100], 100) == 3
    assert lab_run.calls_needed([101], 100) is None


def test_budget_is_a_hard_wall_and_a_step_that_does_not_fit_says_so(monkeypatch, tmp_path):
    fake_steps(
        monkeypatch,
        [
            Step("quick", "lenet", "quick", 1.0, _py(WRITE, "{out}/res")),
            Step("hangs", "gelu", "hangs", 1.0, _py("import time; time.sleep(600)")),
            Step("big", "ops", "big", 10_000.0, _py("pass")),
            Step("never", "dp", "never", 1.0, _py("pass"), cannot_run="needs a GPU"),
        ],
    )
    t0 = time.monotonic()
    state = lab_run.run_lab(tmp_path / "lab", CPU, "tiny", 4.0, list(PARTS), "test", log=lambda _: None)
    assert time.monotonic() - t0 < 30  # the hung step was stopped at the budget, not at its own limit
    steps = state["steps"]
    assert steps["quick"]["status"] == "ok" and (tmp_path / "lab" / "steps" / "quick" / "res" / "r.json").exists()
    assert steps["hangs"]["status"] == "stopped" and "budget ran out" in steps["hangs"]["reason"]
    assert steps["big"] == {**steps["big"], "status": "not run"} and steps["big"]["reason"].startswith(
        "budget (needs ≈10000 s"
    )
    assert steps["never"]["reason"] == "needs a GPU"
    page = (tmp_path / "lab" / "report" / "index.html").read_text()
    assert "not run: budget (needs ≈10000 s" in page and "not run: needs a GPU" in page


def test_sigkill_loses_nothing_finished_and_the_next_call_reruns_the_killed_step(monkeypatch, tmp_path):
    """A stand-in lab in a subprocess, SIGKILLed while its second step runs."""
    root = tmp_path / "lab"
    marker = tmp_path / "second-started"
    script = f"""
import sys
from trainlab.lab import run, steps
from trainlab.hardware import Machine
from trainlab.lab.steps import Command, Step
fake = [Step("first", "lenet", "first", 1.0, Command(("python", "-c", {WRITE!r}, "{{out}}/res"))),
        Step("second", "gelu", "second", 1.0, Command(("python", "-c",
             "import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(600)")))]
run.lab_steps = steps.lab_steps = lambda hw, size: fake
run.run_lab(__import__("pathlib").Path({str(root)!r}), Machine(), "tiny", 300.0, ["lenet", "gelu"], "t")
"""
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    deadline = time.monotonic() + 240  # a wait bound: the budget is the lab's
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the second step never started"
    state = json.loads((root / "results.json").read_text())
    pgid = state["steps"]["second"]["pgid"]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    state = json.loads((root / "results.json").read_text())
    assert state["steps"]["first"]["status"] == "ok" and (root / "steps" / "first" / "res" / "r.json").exists()
    assert state["steps"]["second"]["status"] == "running"
    assert (root / "report" / "index.html").exists() and (root / "lab.tar.gz").exists()
    # the killed lab's step dies with it (parent-death signal), so it cannot compete with its rerun
    for _ in range(50):
        try:
            os.killpg(pgid, 0)
            time.sleep(0.1)
        except ProcessLookupError:
            break
    else:
        pytest.fail("the killed lab's step is still running")
    marker.unlink()
    fake_steps(
        monkeypatch,
        [
            Step("first", "lenet", "first", 1.0, _py("raise SystemExit(3)")),
            Step("second", "gelu", "second", 1.0, _py(WRITE, "{out}/res")),
        ],
    )
    state = lab_run.run_lab(root, Machine(), "tiny", 60.0, ["lenet", "gelu"], "t2", log=lambda _: None)
    assert state["steps"]["first"]["status"] == "ok"  # kept: not run again (its stand-in now would fail)
    assert state["steps"]["second"]["status"] == "ok" and not list((root / "steps").glob(".*partial"))
    assert len(state["calls"]) == 2


def _files(folder: Path) -> set[str]:
    """Every file under `folder` but git's and Python's own caches (importing writes __pycache__)."""
    skip = {".git", "__pycache__", ".pytest_cache", ".ruff_cache"}
    return {
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and not skip.intersection(p.relative_to(folder).parts)
    }


def test_lab_from_another_working_folder_writes_only_into_the_lab_folder(monkeypatch, tmp_path):
    """Issue 31: `trainlab lab --out lab` from a folder that is not the checkout. A step gets its
    {out} and writes one file relative to its working folder: both land in DIR/steps/NAME, none in
    the checkout or the caller's folder."""
    fake_steps(
        monkeypatch,
        [
            Step(
                "writes",
                "lenet",
                "writes",
                1.0,
                _py(WRITE + "; pathlib.Path('stray.txt').write_text('relative')", "{out}/res"),
            )
        ],
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    checkout = _files(ROOT)
    # the CLI counts its budget from its process's start: this pytest process may be many minutes old
    monkeypatch.setattr(lab_run, "process_age_s", lambda: 0.0)
    assert main(["lab", "--out", "lab", "--size", "tiny", "--device", "cpu", "--parts", "lenet", "--budget", "2m"]) == 0
    lab = elsewhere / "lab"
    assert (lab / "steps" / "writes" / "res" / "r.json").exists() and (lab / "steps" / "writes" / "stray.txt").exists()
    assert _files(elsewhere) == {str(Path("lab") / f) for f in _files(lab)}  # nothing beside the lab folder
    assert _files(ROOT) == checkout  # nothing new in the checkout
    state = json.loads((lab / "results.json").read_text())
    command = state["steps"]["writes"]["command"]  # as a student types it in the lab folder: no machine's paths
    assert command.endswith(" steps/writes/res") and str(elsewhere) not in command
    assert (lab / "steps" / "writes" / "log.txt").read_text().startswith("$ " + command + "\n")


def test_archive_holds_results_and_report_and_stays_under_its_cap(monkeypatch, tmp_path):
    monkeypatch.setattr(lab_run, "ARCHIVE_MAX_BYTES", 3 * 2**20)
    root = tmp_path / "lab"
    (root / "steps" / "big").mkdir(parents=True)
    (root / "steps" / "big" / "noise.bin").write_bytes(os.urandom(4 * 2**20))  # incompressible, over the cap
    (root / "steps" / "big" / "log.txt").write_text("small\n")
    (root / "cache").mkdir()
    (root / "cache" / "ext.so").write_bytes(b"x" * 1000)
    (root / "results.json").write_text("{}")
    (root / "report").mkdir()
    (root / "report" / "index.html").write_text("<html></html>")
    path = lab_run.write_archive(root)
    assert path.stat().st_size <= 3 * 2**20
    with tarfile.open(path) as tar:
        names = tar.getnames()
        left_out = tar.extractfile("lab/ARCHIVE_LEFT_OUT.txt").read().decode()
    assert {"lab/results.json", "lab/report/index.html", "lab/steps/big/log.txt"} <= set(names)
    assert "lab/steps/big/noise.bin" not in names and "steps/big/noise.bin" in left_out
    assert not any("cache" in n for n in names)  # extension builds stay out


@pytest.mark.slow
def test_tiny_lab_end_to_end_killed_mid_step_resumed_and_reported(tmp_path):
    """`trainlab lab` on tiny sizes, SIGKILLed mid-step, resumed, finished: the LeNet, GELU and own-operator
    parts (7 steps that ran, about 30 s on the quiet 2-core box) under a budget they fit even on a loaded box,
    so the same steps run on every machine. It ran every part under a 2-minute budget before, which is what
    the test cost (~100 s of CPU), and how many steps got to run depended on the box's load (issue 37: CI
    time). The budget's wall is test_budget_is_a_hard_wall_and_a_step_that_does_not_fit_says_so's subject."""
    out = tmp_path / "lab"
    parts = ("lenet", "gelu", "ops")
    cmd = [sys.executable, "-m", "trainlab", "lab", "--out", str(out), "--size", "tiny", "--parts", ",".join(parts)]
    cmd += ["--budget", "5m"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRAINLAB_CACHE": str(default_cache_dir().parent)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240  # a wait bound: the budget is the lab's
    try:
        while time.monotonic() < deadline:  # kill it while the second real step runs
            try:
                steps = json.loads((out / "results.json").read_text())["steps"]
            except (OSError, ValueError, KeyError):
                steps = {}
            if steps.get("gelu_check", {}).get("status") == "running":
                break
            time.sleep(0.2)
        else:
            pytest.fail("the lab did not reach its second step in 240 s")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    first = json.loads((out / "results.json").read_text())
    assert first["steps"]["lenet_train"]["status"] == "ok" and first["steps"]["gelu_check"]["status"] == "running"
    t0 = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert time.monotonic() - t0 < 300 + 60  # the budget holds (plus start-up and the last report)
    state = json.loads((out / "results.json").read_text())
    assert "kept (ok" in done.stdout and "lenet_train" in done.stdout
    statuses = {name: s["status"] for name, s in state["steps"].items()}
    assert statuses["gelu_check"] == "ok"  # the killed step ran again
    ran = [step for step in lab_steps(CPU, "tiny") if step.part in parts]
    assert list(statuses) == [step.name for step in ran]  # the parts asked for, no other
    assert [n for n, status in statuses.items() if status == "ok"] == [
        "lenet_train",
        "gelu_check",
        "gelu_bench",
        "gelu_train",
        "ops_check",
        "ops_bench",
        "ops_train",
    ]
    for s in state["steps"].values():  # the two that cannot run on a CPU at this size say why
        assert s["status"] == "ok" or s["reason"].startswith(("trains to 99 %", "not applicable")), s
    page = html.unescape((out / "report" / "index.html").read_text())  # the page's text, entities decoded
    from trainlab.report.lab_text import TOC

    for _, heading in TOC:  # the handout's §6, in its order, and what the lab does beyond it
        assert heading in page
    for step in ran:  # every step: its measurement, or the line that says why not
        assert step.title in page
        assert (
            statuses[step.name] == "ok" or f"{step.name}: not run: " in page or f"{step.name}: not finished (" in page
        )
    with tarfile.open(out / "lab.tar.gz") as tar:
        assert "lab/results.json" in tar.getnames()
    assert (out / "lab.tar.gz").stat().st_size <= 16 * 2**20
    check_lab_report_facts(out, tmp_path / "report-again")  # every fact its report states is recorded
    result = overflow(out / "report" / "index.html", width=900)  # (skips without Chromium: last)
    assert not result["bad"], result
