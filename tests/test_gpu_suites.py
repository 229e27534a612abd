"""The GPU suites in their CPU dry-run mode: every step runs, results are packed into at most 8 files
after every step (a kill leaves what was done), and committed results are never overwritten.

On a GPU machine the same scripts run the real thing (`benchmarks/gpu_suite.sh lenet|gpt --out DIR`);
here they run with tiny sizes so the scripts cannot rot between the rare GPU sessions."""

import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from trainlab.data.mnist import default_cache_dir

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 150


def _env():
    # reuse this machine's MNIST cache (the suite would otherwise convert the CSVs once more)
    return {**os.environ, "PY": sys.executable, "TRAINLAB_CACHE": str(default_cache_dir().parent)}


def _suite(part, out, work, *extra, **kw):
    return subprocess.run(["bash", "benchmarks/gpu_suite.sh", part, "--out", str(out), "--work", str(work), "--dry-run",
                           "--budget", str(BUDGET_S), *extra], cwd=ROOT, env=_env(), capture_output=True, text=True, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("part", ["lenet", "ops", "gpt"])
def test_dry_run_completes_within_budget_and_packs_results(tmp_path, part):
    out, work = tmp_path / "out", tmp_path / "work"
    t0 = time.monotonic()
    proc = _suite(part, out, work, timeout=BUDGET_S + 120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert elapsed < BUDGET_S + 60
    files = sorted(p.name for p in out.iterdir())
    assert files == [f"{part}_raw.tar.gz", f"{part}_suite.log", f"{part}_summary.md"]   # ≤ 8 with both parts
    summary = (out / f"{part}_summary.md").read_text()
    table = summary.split("| step | exit |")[1].split("\n\n")[0]
    rows = [line.split("|")[1:4] for line in table.splitlines()[2:]]
    assert rows and all(exit_code.strip() == "0" for _, exit_code, _ in rows), summary   # nothing failed or skipped
    with tarfile.open(out / f"{part}_raw.tar.gz") as tar:
        names = tar.getnames()
    for name, _, _ in rows:
        assert f"./{name.strip()}.log" in names
    assert not any(".cache" in n for n in names)   # builds and caches stay out of the pack
    # a second run into the same directory refuses instead of overwriting
    again = _suite(part, out, tmp_path / "work2", timeout=60)
    assert again.returncode == 2 and "already holds" in again.stderr


@pytest.mark.slow
def test_a_kill_mid_run_leaves_the_finished_steps(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.Popen(["bash", "benchmarks/gpu_suite.sh", "lenet", "--out", str(out), "--work", str(work),
                             "--dry-run"], cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            log = out / "lenet_suite.log"
            if log.exists() and "data: exit" in log.read_text():
                break
            time.sleep(0.5)
        else:
            pytest.fail("the suite did not finish its first steps in 120 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)   # the device tool's limit, or a lost machine
        proc.wait()
    with tarfile.open(out / "lenet_raw.tar.gz") as tar:
        names = tar.getnames()
    assert "./env.log" in names and "./data.log" in names
    assert "| data | 0 |" in (out / "lenet_summary.md").read_text()


def test_bad_arguments_are_refused(tmp_path):
    proc = subprocess.run(["bash", "benchmarks/gpu_suite.sh", "lenet", "--dry-run"], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "--out DIR is required" in proc.stderr
    proc = subprocess.run(["bash", "benchmarks/gpu_suite.sh", "resnet", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "usage" in proc.stderr
    proc = subprocess.run(["bash", "benchmarks/gpu_suite.sh", "lenet", "--out", str(tmp_path / "o"), "--work",
                           str(tmp_path / "o" / "w"), "--dry-run"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "outside --out" in proc.stderr
    proc = subprocess.run(["bash", "benchmarks/gpu_suite.sh", "lenet", "--out", str(tmp_path / "o2"), "--mnist",
                           str(tmp_path / "missing.npz"), "--dry-run"], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "trainlab data pack" in proc.stderr
