"""A hung or dead rank makes the others fail with an error within the process-group timeout."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from gpt_plans import make_plan

from trainlab.distributed.launch import DistInfo
from trainlab.distributed.spawn import SpawnError, spawn_for_test
from trainlab.gpt.engine import GPTEngine

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]


def _one_rank_hangs(info: DistInfo):
    engine = GPTEngine(make_plan("tiny", "ddp", world=info.world_size, global_batch=2, micro_batch=1, seq_len=8), info)
    if info.rank == 1:
        time.sleep(60)  # never joins the gradient all-reduce
    return engine.train_step(torch.zeros(2, 8, dtype=torch.long))


def _one_rank_dies(info: DistInfo):
    if info.rank == 1:
        os._exit(3)  # killed without any cleanup, like an OOM-killed worker
    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t)


def test_hung_rank_times_out_instead_of_hanging():
    t0 = time.monotonic()
    with pytest.raises(SpawnError) as err:
        spawn_for_test(_one_rank_hangs, 2, timeout_s=50, pg_timeout_s=3)
    elapsed = time.monotonic() - t0
    # rank 0 raised from the collective because of the 3 s process-group timeout, long before
    # rank 1's 60 s sleep or the harness's 50 s limit
    assert "rank 0 failed" in str(err.value)
    # the engine names the cause in one line (PeerFailure, a HardwareError → `trainlab: error: ...` in the CLI)
    assert "PeerFailure: rank 0/2: a collective failed: another rank died or stalled longer than the 3 s" in str(
        err.value
    )
    assert elapsed < 45


def test_dead_rank_fails_the_run():
    t0 = time.monotonic()
    with pytest.raises(SpawnError):
        spawn_for_test(_one_rank_dies, 2, timeout_s=50, pg_timeout_s=3)
    assert time.monotonic() - t0 < 45


def _what_the_rank_sees(info: DistInfo):
    return os.environ.get("TRAINLAB_SPAWN_PROBE"), os.getcwd(), info.rank


def test_ranks_see_the_callers_environment_and_folder_at_the_call(monkeypatch, tmp_path):
    """The ranks fork from a forkserver started once per process (distributed.spawn): what the caller sets
    after it started must still reach them, as it reaches a freshly spawned process."""
    spawn_for_test(_what_the_rank_sees, 2)  # the server is running before the caller changes anything
    for probe in ("first", "second"):
        monkeypatch.setenv("TRAINLAB_SPAWN_PROBE", probe)
        monkeypatch.chdir(tmp_path)
        assert spawn_for_test(_what_the_rank_sees, 2) == [(probe, str(tmp_path), 0), (probe, str(tmp_path), 1)]
