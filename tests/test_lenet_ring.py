"""The hand-written ring all-reduce (`--parallel ring`) and uneven shards, on 2 and 4 CPU processes (gloo).

One spawned job per world size: the ring against `dist.all_reduce` on tensors of awkward sizes, the
bytes it sends against 2(W−1)/W·S, the order in which backward hooks launch its buckets, and short
trainings under ddp / allreduce / ring with a global batch the world size does not divide. Each test
then checks one property against `dist.all_reduce` or against single-process training on the same
global batches.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.distributed as dist

from trainlab.distributed.spawn import spawn_for_test
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train
from trainlab.lenet.model import LeNet5
from trainlab.lenet.ring import RingAllReduce, ring_allreduce_

pytestmark = pytest.mark.dist

SIZES = (1, 3, 5, 64, 1000, 4097)  # fewer elements than ranks, not divisible by W, divisible by W
MODES = ("ddp", "allreduce", "ring")
# 250 images = 8 global batches of 30 (or 31) + a last one of 10 (or 2): uneven shards everywhere.
BATCH = {2: 31, 4: 30}
BASE = dict(
    epochs=2,
    train_subset=250,
    test_subset=203,
    optimizer="sgd",
    lr=0.1,
    device="cpu",
    progress=False,
    tensorboard=False,
    gpu_telemetry=False,
    seed=3,
)


def quiet(*_a, **_k):
    pass


def _job(info, tmp):
    world, rank = info.world_size, info.rank
    out = {"tensors": {}, "sent": {}}
    for n in SIZES:
        # integer values: any summation order gives the exact same sum, so the comparison is exact
        ints = torch.randint(-1000, 1000, (n,), generator=torch.Generator().manual_seed(n * 31 + rank)).float()
        reference = ints.clone()
        dist.all_reduce(reference)
        mine = ints.clone()
        out["sent"][n] = ring_allreduce_(mine, None)
        out["tensors"][n] = (torch.equal(mine, reference), mine[:3].tolist())
        floats = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n + 100 * rank))
        ref_f = floats.clone()
        dist.all_reduce(ref_f)
        ring_allreduce_(floats, None)
        out["tensors"][f"{n}-float64-maxdiff"] = float((floats - ref_f).abs().max())

    # Backward launches buckets while it still runs: log bucket launches between gradient hooks.
    model = LeNet5()
    events = []
    reducer = RingAllReduce(model, world)
    launch = reducer._launch
    reducer._launch = lambda i: (events.append(f"bucket{i}"), launch(i))[1]
    for name, p in model.named_parameters():  # registered after the reducer's hooks, so they run after them
        p.register_post_accumulate_grad_hook(lambda _p, name=name: events.append(name))
    torch.manual_seed(rank)
    model(torch.randn(4, 1, 28, 28)).square().mean().backward()
    reducer.sync()
    out["events"] = events
    names = {id(p): n for n, p in model.named_parameters()}
    out["buckets"] = [[names[id(p)] for p in b] for b in reducer.buckets]
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(grads) for _ in range(world)]
    dist.all_gather(gathered, grads)
    out["replicas_equal"] = all(torch.equal(g, gathered[0]) for g in gathered)
    reducer.close()

    for mode in MODES:
        s = train(TrainConfig(**BASE, batch_size=BATCH[world], parallel=mode, out=f"{tmp}/{mode}"), log=quiet)
        out[mode] = {"test_loss": s["test_loss"], "world_size": s["world_size"]}
    return out


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"{w}ranks")
def job(request, tmp_path_factory):
    world = request.param
    tmp = tmp_path_factory.mktemp(f"ring{world}")
    ranks = spawn_for_test(_job, world, str(tmp), timeout_s=300)
    single = train(TrainConfig(**BASE, batch_size=BATCH[world], out=str(tmp / "single")), log=quiet)
    return world, tmp, ranks, single


def test_ring_equals_dist_all_reduce(job):
    world, _, ranks, _ = job
    for r in ranks:
        for n in SIZES:
            assert r["tensors"][n][0], f"rank of {world}: ring ≠ all_reduce for {n} elements ({r['tensors'][n][1]})"
            assert r["tensors"][f"{n}-float64-maxdiff"] < 1e-12 * world
    assert ranks[0]["tensors"][1000][1] == ranks[-1]["tensors"][1000][1]  # every rank holds the same sum


def test_ring_sends_2_w_minus_1_over_w_of_the_buffer(job):
    world, _, ranks, _ = job
    for r in ranks:
        nbytes = 64 * 4
        assert r["sent"][64] == 2 * (world - 1) * nbytes // world  # the bandwidth-optimal amount, exactly
        chunk = -(-4097 // world) * 4  # ≤ one element of rounding per chunk
        assert abs(r["sent"][4097] - 2 * (world - 1) * 4097 * 4 / world) <= 2 * (world - 1) * 4
        assert r["sent"][4097] <= 2 * (world - 1) * chunk


def test_backward_hooks_launch_buckets_before_backward_ends(job):
    _, _, ranks, _ = job
    r = ranks[0]
    events, buckets = r["events"], r["buckets"]
    assert len(buckets) >= 3  # LeNet-5 split so there is something to overlap
    # backward's order: the output layer's gradients first, the first convolution's last
    assert buckets[0][0] == "classifier.7.bias" and buckets[-1][-1] == "features.0.weight"
    # bucket 0 (the last layers) is on its way before the first layer's gradient exists
    assert events.index("bucket0") < events.index("features.0.weight")
    assert [e for e in events if e.startswith("bucket")] == [f"bucket{i}" for i in range(len(buckets))]
    assert all(r["replicas_equal"] for r in ranks)


def _params(run_dir):
    return torch.load(run_dir / "checkpoint.pt", weights_only=False)["model"]


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", MODES)
def test_uneven_shards_train_exactly_like_one_process(job, mode):
    # W does not divide the global batch (31 over 2 ranks, 30 over 4, last batches of 2 and 10): with
    # shard-size weighting every mode takes the single process's steps. Unweighted averaging would
    # give the smaller shards' images more weight and move the parameters by ~1e-3 here.
    world, tmp, ranks, single = job
    assert [r[mode]["world_size"] for r in ranks] == [world] * world
    ref, got = _params(tmp / "single"), _params(tmp / mode)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=2e-5, msg=f"{mode}×{world}: {k} differs")
    a, b = _records(tmp / mode), _records(tmp / "single")
    steps = lambda rs, key: [x for r in rs for x in r[key]]  # noqa: E731
    torch.testing.assert_close(
        torch.tensor(steps(a, "step_losses")), torch.tensor(steps(b, "step_losses")), rtol=1e-4, atol=1e-5
    )
    assert steps(a, "step_accuracies") == pytest.approx(steps(b, "step_accuracies"), abs=100 / 30 + 1e-9)  # ≤ 1 image
    assert [r["train_accuracy"] for r in a] == pytest.approx([r["train_accuracy"] for r in b], abs=0.5)


def test_ring_training_equals_ddp_training(job):
    # The two multi-process implementations side by side (each also equals one process, above).
    world, tmp, _, _ = job
    ring, ddp = _params(tmp / "ring"), _params(tmp / "ddp")
    for k in ddp:
        torch.testing.assert_close(ring[k], ddp[k], rtol=1e-5, atol=1e-6, msg=f"ring vs ddp ×{world}: {k}")


def test_sharded_evaluation_equals_one_process(job):
    # Each rank scored its shard of the 203 test images (uneven: 203 = 101 + 102, 50 + 51 + 51 + 51);
    # the gathered confusion matrix, loss and per-image predictions are one model's.
    world, tmp, ranks, single = job
    for mode in MODES:
        assert len({r[mode]["test_loss"] for r in ranks}) == 1  # every rank got the same gathered result
        assert ranks[0][mode]["test_loss"] == pytest.approx(single["test_loss"], rel=1e-4)
        summary = json.loads((tmp / mode / "summary.json").read_text())
        assert summary["confusion_matrix"] == single["confusion_matrix"]
        assert int(np.array(summary["confusion_matrix"]).sum()) == 203
        got, ref = np.load(tmp / mode / "misclassified.npz"), np.load(tmp / "single" / "misclassified.npz")
        assert got["index"].tolist() == ref["index"].tolist() and int(got["total"]) == int(ref["total"])


def test_unweighted_averaging_would_be_measurably_wrong():
    # Guards the test above: with these shards the naive mean of per-rank mean losses is not the global
    # mean, so an implementation that ignored the weights could not pass it.
    from trainlab.data.loader import DeviceLoader
    from trainlab.data.mnist import load_mnist

    data = load_mnist(None)
    images, labels = data.train_images[:250], data.train_labels[:250]
    loader = DeviceLoader(images, labels, 30, "cpu", rank=0, world_size=4, seed=3)
    assert any(w != 1.0 for w in loader.shard_weights())
    assert loader.shard_weights()[-1] == pytest.approx(4 * 2 / 10)  # last global batch: 2, 3, 2, 3 rows


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="a NCCL ring needs 2+ GPUs (one rank per GPU)")
def test_ring_on_two_gpus_equals_one_gpu(tmp_path):
    # The CUDA path: NCCL send/recv grouped by batch_isend_irecv, the comm stream waiting on the
    # backward's events, the optimizer's stream waiting on the comm stream. 2 ranks, uneven shards.
    from trainlab.cli import main

    small = [
        "--epochs",
        "1",
        "--train-subset",
        "1000",
        "--test-subset",
        "500",
        "--batch-size",
        "99",
        "--optimizer",
        "sgd",
        "--lr",
        "0.05",
        "--amp",
        "off",
        "--channels-last",
        "off",
        "--no-progress",
        "--no-tensorboard",
        "--no-gpu-telemetry",
    ]
    assert main(["train", *small, "--device", "cuda", "--out", str(tmp_path / "one")]) == 0
    assert (
        main(
            ["train", *small, "--device", "cuda", "--parallel", "ring", "--nproc", "2", "--out", str(tmp_path / "ring")]
        )
        == 0
    )
    ref, got = _params(tmp_path / "one"), _params(tmp_path / "ring")
    for k in ref:
        torch.testing.assert_close(got[k].cpu(), ref[k].cpu(), rtol=1e-3, atol=1e-4, msg=k)
    assert json.loads((tmp_path / "ring" / "summary.json").read_text())["world_size"] == 2
