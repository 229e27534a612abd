"""Data-parallel LeNet-5 with 2 processes on CPU (gloo) against single-process training.

One spawned 2-rank job (the module fixture) trains ddp and allreduce and an interrupted-then-resumed
ddp run; each test then checks one property against a single-process run on the same global batches.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from trainlab.distributed.spawn import free_port, spawn_for_test
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train

pytestmark = pytest.mark.dist

# SGD: its update is linear in the gradient, so float-level differences stay float-level (Adam's
# m/√v can amplify a rounding difference in a near-zero gradient to a full step).
BASE = dict(
    epochs=2,
    train_subset=512,
    test_subset=300,
    batch_size=64,
    optimizer="sgd",
    lr=0.05,
    device="cpu",
    progress=False,
    tensorboard=False,
    gpu_telemetry=False,
    seed=1,
)  # 8 steps per epoch


def quiet(*_a, **_k):
    pass


def _ranks_job(info, tmp):
    """Runs in each of 2 ranks: ddp, allreduce, and ddp interrupted after 1 epoch then resumed."""
    out = {}
    for mode in ("ddp", "allreduce"):
        s = train(TrainConfig(**BASE, parallel=mode, out=f"{tmp}/{mode}"), log=quiet)
        out[mode] = {"test_loss": s["test_loss"], "world_size": s["world_size"]}
    part = TrainConfig(**BASE, parallel="ddp", out=f"{tmp}/ddp_part", stop_after=1)
    out["partial"] = train(part, log=quiet)
    dist.barrier()  # rank 0 has written the checkpoint the others are about to read
    resumed = TrainConfig(**{**part.to_dict(), "stop_after": None})
    out["resumed"] = {"test_loss": train(resumed, resume=f"{tmp}/ddp_part", log=quiet)["test_loss"]}
    s = train(TrainConfig(**{**BASE, **EMA_TTA}, parallel="ddp", out=f"{tmp}/ddp_ema"), log=quiet)
    out["ema_tta"] = {k: s[k] for k in ("test_accuracy", "tta_test_accuracy", "test_loss")}
    return out


EMA_TTA = dict(ema=0.9, tta=True, test_subset=301)  # 301 test images: shards of 151 and 150


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dp")
    ranks = spawn_for_test(_ranks_job, 2, str(tmp), timeout_s=240)
    single = train(TrainConfig(**BASE, parallel="none", out=str(tmp / "single")), log=quiet)
    single["ema_tta"] = train(
        TrainConfig(**{**BASE, **EMA_TTA}, parallel="none", out=str(tmp / "single_ema")), log=quiet
    )
    return tmp, ranks, single


def _params(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]


def _step_losses(run_dir):
    return [x for line in (run_dir / "metrics.jsonl").read_text().splitlines() for x in json.loads(line)["step_losses"]]


@pytest.mark.parametrize("mode", ["ddp", "allreduce"])
def test_two_ranks_match_single_process_training(runs, mode):
    tmp, ranks, single = runs
    assert [r[mode]["world_size"] for r in ranks] == [2, 2]
    ref, got = _params(tmp / "single"), _params(tmp / mode)
    assert set(ref) == set(got)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=2e-5, msg=f"{mode}: parameter {k} differs")
    # Logged losses are the mean over ranks of each rank's shard loss = the global batch's mean loss.
    torch.testing.assert_close(
        torch.tensor(_step_losses(tmp / mode)), torch.tensor(_step_losses(tmp / "single")), rtol=1e-4, atol=1e-5
    )
    assert len(_step_losses(tmp / mode)) == 16
    # Every replica ends identical: both ranks evaluate the full test set to the same loss.
    assert ranks[0][mode]["test_loss"] == ranks[1][mode]["test_loss"]
    assert ranks[0][mode]["test_loss"] == pytest.approx(single["test_loss"], rel=1e-4)


def test_training_actually_moved_the_parameters(runs):
    # Guards the test above against comparing two untrained models.
    tmp, _, _ = runs
    from trainlab.lenet.plan import resolve
    from trainlab.lenet.setup import build_model

    init = build_model(resolve(TrainConfig(**BASE), torch.device("cpu"))).state_dict()
    trained = _params(tmp / "ddp")
    assert max((trained[k] - init[k]).abs().max().item() for k in init) > 1e-3


def test_resume_under_ddp_equals_uninterrupted_ddp(runs):
    tmp, ranks, _ = runs
    assert all(r["partial"]["interrupted"] and r["partial"]["epochs_done"] == 1 for r in ranks)
    full, resumed = _params(tmp / "ddp"), _params(tmp / "ddp_part")
    for k in full:
        torch.testing.assert_close(resumed[k], full[k], rtol=1e-6, atol=1e-7, msg=k)
    assert _step_losses(tmp / "ddp_part") == pytest.approx(_step_losses(tmp / "ddp"), rel=1e-6)
    assert ranks[0]["resumed"]["test_loss"] == pytest.approx(ranks[0]["ddp"]["test_loss"], rel=1e-6)


def test_ema_and_tta_are_scored_over_the_whole_test_set_under_ddp(runs):
    # Each rank tests its shard; the EMA model's loss/accuracy and the TTA counts must be summed over
    # ranks, so they equal one process scoring all 301 images (a count over rank 0's 151 would not be
    # a whole number of images out of 301).
    _, ranks, single = runs
    ours, ref = ranks[0]["ema_tta"], single["ema_tta"]
    assert ranks[1]["ema_tta"] == ours
    n = EMA_TTA["test_subset"]
    for key in ("test_accuracy", "tta_test_accuracy"):
        count = ours[key] * n / 100
        assert count == pytest.approx(round(count), abs=1e-6), (key, ours[key])
        assert abs(ours[key] - ref[key]) <= 100 / n + 1e-9, (key, ours[key], ref[key])  # at most one image apart
    assert ours["test_loss"] == pytest.approx(ref["test_loss"], rel=1e-4)


# ---- a crashed rank: the survivor exits with one clear line, well within a short timeout ---------

_CRASH_ON_RANK_1 = """
import os, sys, torch
from trainlab.cli import main
if os.environ["RANK"] == "1":
    step = torch.optim.SGD.step
    calls = [0]
    def dying_step(self, *a, **k):
        calls[0] += 1
        if calls[0] == 3:
            os._exit(17)  # a hard crash: no exception, no cleanup, sockets just close
        return step(self, *a, **k)
    torch.optim.SGD.step = dying_step
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_rank_makes_the_other_exit_with_a_clear_error(tmp_path):
    # Plain processes with RANK/WORLD_SIZE/MASTER_* set by hand — what torchrun sets on each node —
    # and no torchrun agent that would kill the survivor for us: the process-group timeout must.
    # Timed from rank 1's death, not from the start: start-up (imports, data) on a loaded shared box
    # can take a minute by itself, which made a bound on the whole run flaky.
    port = free_port()
    argv = [
        "train",
        "--parallel",
        "ddp",
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
        "10",
        "--out",
        str(tmp_path / "run"),
    ]
    procs, logs = [], []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        logs.append(open(tmp_path / f"rank{rank}.err", "w+"))  # a file, not a pipe: nothing can block on it
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _CRASH_ON_RANK_1, *argv],
                env=env,
                text=True,
                stdout=subprocess.DEVNULL,
                stderr=logs[-1],
            )
        )
    try:
        procs[1].wait(timeout=600)
        died = time.monotonic()
        procs[0].wait(timeout=120)
        survivor_s = time.monotonic() - died
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for f in logs:
            f.close()
    err0 = (tmp_path / "rank0.err").read_text()
    assert procs[1].returncode == 17, (tmp_path / "rank1.err").read_text()[-2000:]
    assert procs[0].returncode == 2, err0[-2000:]
    lines = [line for line in err0.splitlines() if line.startswith("trainlab: error:")]
    assert len(lines) == 1, err0[-2000:]
    assert "rank 0/2" in lines[0] and "another rank crashed" in lines[0] and "10 s" in lines[0]
    assert "Traceback" not in err0
    assert survivor_s < 10 + 30, survivor_s  # the 10 s timeout at most (a closed socket is noticed at once)
