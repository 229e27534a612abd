"""`--shard-weights`: a split of every global batch in proportion to per-rank weights (given, or
measured with `auto`) changes where images are computed, never what is computed: 2 CPU ranks match
single-process training loss for loss and parameter for parameter."""

from __future__ import annotations

import json
import os

import pytest
import torch

from trainlab.data.loader import DeviceLoader, shard_bounds
from trainlab.distributed.spawn import spawn_for_test
from trainlab.errors import ConfigError
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train
from trainlab.lenet.shard_weights import SLOW_ENV, check_shard_weights, parse_shard_weights, slowdown_factor

# SGD keeps float-level differences float-level (see test_lenet_dp_dist); 8 steps per epoch.
BASE = dict(
    epochs=2,
    train_subset=512,
    test_subset=200,
    batch_size=64,
    optimizer="sgd",
    lr=0.05,
    device="cpu",
    progress=False,
    tensorboard=False,
    gpu_telemetry=False,
    seed=3,
)


def quiet(*_a, **_k):
    pass


def test_weighted_bounds_tile_the_batch_in_proportion():
    for n, shares in ((64, (3, 1)), (100, (1, 2, 1)), (7, (0.5, 0.25, 0.25)), (255, (1815.8, 503.2))):
        bounds = [shard_bounds(n, r, len(shares), 10, shares) for r in range(len(shares))]
        assert bounds[0][0] == 10 and bounds[-1][1] == 10 + n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous, no gap, no overlap
        for (lo, hi), w in zip(bounds, shares):
            assert abs((hi - lo) - n * w / sum(shares)) <= 1  # rounding moves at most one row
    assert [shard_bounds(64, r, 2, 0, (3, 1)) for r in range(2)] == [(0, 48), (48, 64)]


def test_loss_weights_make_the_averaged_gradient_the_global_mean():
    # W·n_r/n per rank: averaging the ranks' weighted mean-loss gradients is the global batch's gradient
    images, labels = torch.zeros(130, 28, 28, dtype=torch.uint8), torch.zeros(130, dtype=torch.long)
    loaders = [DeviceLoader(images, labels, 64, "cpu", rank=r, world_size=2, shares=(3, 1)) for r in range(2)]
    w0, w1 = loaders[0].shard_weights(), loaders[1].shard_weights()
    assert w0 == [2 * 48 / 64, 2 * 48 / 64] and w1 == [2 * 16 / 64, 2 * 16 / 64]  # the last 2 images: dropped
    assert len(loaders[0]) == 2  # a 3:1 split of a 2-image batch would leave rank 1 none


def test_parse_and_check():
    assert parse_shard_weights(None) is None and parse_shard_weights("auto") == "auto"
    assert parse_shard_weights("2,1") == (2.0, 1.0)
    for bad in ("2", "2,-1", "a,b", "1,inf", "1,nan", ""):
        with pytest.raises(ConfigError, match="expected auto or one positive number per rank"):
            parse_shard_weights(bad)
    with pytest.raises(ConfigError, match="needs --parallel ddp"):
        check_shard_weights("auto", "none", 1, 64)
    with pytest.raises(ConfigError, match="rank 1 would get no image of a global batch of 8"):
        check_shard_weights("100,1", "ddp", 2, 8)


def test_slowdown_env(monkeypatch):
    monkeypatch.setenv(SLOW_ENV, "1:2.5")
    assert slowdown_factor(0) == 1.0 and slowdown_factor(1) == 2.5
    monkeypatch.setenv(SLOW_ENV, "1:0.5")
    with pytest.raises(ConfigError, match="a factor is a finite number >= 1"):
        slowdown_factor(1)


def _ranks_job(info, tmp):
    out = {}
    s = train(TrainConfig(**BASE, parallel="ddp", shard_weights="3,1", out=f"{tmp}/fixed"), log=quiet)
    out["fixed"] = s["shard_weights"]
    os.environ[SLOW_ENV] = "1:6"  # rank 1 runs at a sixth of its speed: `auto` must notice
    s = train(TrainConfig(**BASE, parallel="allreduce", shard_weights="auto", out=f"{tmp}/auto"), log=quiet)
    out["auto"] = s["shard_weights"]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shards")
    ranks = spawn_for_test(_ranks_job, 2, str(tmp), timeout_s=300)
    train(TrainConfig(**BASE, parallel="none", out=str(tmp / "single")), log=quiet)
    return tmp, ranks


def _step_losses(run_dir):
    return [x for line in (run_dir / "metrics.jsonl").read_text().splitlines() for x in json.loads(line)["step_losses"]]


@pytest.mark.dist
@pytest.mark.parametrize("name", ["fixed", "auto"])
def test_weighted_split_equals_single_process(runs, name):
    tmp, ranks = runs
    ref, got = _step_losses(tmp / "single"), _step_losses(tmp / name)
    assert len(got) == len(ref) == 16
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=1e-5)
    a = torch.load(tmp / "single" / "checkpoint.pt", weights_only=False)["model"]
    b = torch.load(tmp / name / "checkpoint.pt", weights_only=False)["model"]
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=2e-5, msg=k)


@pytest.mark.dist
def test_shares_recorded_and_auto_follows_the_slow_rank(runs):
    _, ranks = runs
    assert ranks[0]["fixed"]["shares"] == [3.0, 1.0] and ranks[1]["fixed"]["shares"] == [3.0, 1.0]
    auto = ranks[0]["auto"]
    assert auto["spec"] == "auto" and auto["shares"] == ranks[1]["auto"]["shares"]  # every rank split alike
    fast, slow = auto["measured_images_per_s"]
    assert slow < fast / 2, auto  # a 6× slowdown, measured through a loaded machine's noise
    assert ranks[1]["auto"]["slowdown"] == 6.0
