"""Data-parallel LeNet-5 in one process: bad input fails before anything starts, buckets, timing,
and the world-of-one modes against the plain trainer."""

import json

import pytest
import torch

from trainlab.cli import main
from trainlab.errors import ConfigError, HardwareError
from trainlab.lenet.allreduce import make_buckets
from trainlab.lenet.batches import build_train_batches
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.data_parallel import DataParallelContext, check_launch, setup_data_parallel
from trainlab.lenet.loop import train
from trainlab.lenet.model import LeNet5

SMALL = dict(
    epochs=1,
    train_subset=384,
    test_subset=200,
    batch_size=64,
    device="cpu",
    progress=False,
    tensorboard=False,
    gpu_telemetry=False,
)


def quiet(*_a, **_k):
    pass


def _error_line(capsys, argv):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainlab: error: "), err
    assert "launching" not in out  # nothing was started
    return lines[0]


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--parallel", "pipeline"], ["--parallel 'pipeline'", "none, dp, ddp, allreduce"]),
        (["--parallel", "ring", "--nproc", "3", "--batch-size", "2"], ["--batch-size 2", "smaller than --nproc 3"]),
        (["--parallel", "none", "--nproc", "2"], ["--nproc 2", "--parallel ddp, allreduce or ring"]),
        (["--parallel", "ddp", "--nproc", "0"], ["--nproc 0", "expected an integer >= 1"]),
        (["--parallel", "dp", "--device", "cpu"], ["--parallel dp", "CUDA GPUs"]),
        (["--parallel", "ddp", "--dist-timeout", "0"], ["--dist-timeout 0", "expected a finite number > 0"]),
    ],
)
def test_bad_launches_are_one_line_errors_before_anything_starts(tmp_path, capsys, argv, needles):
    line = _error_line(capsys, ["train", "--device", "cpu", "--out", str(tmp_path / "r"), *argv])
    for needle in needles:
        assert needle in line, line
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has 2+ GPUs")
def test_dataparallel_with_fewer_than_two_gpus_refuses(tmp_path, capsys):
    line = _error_line(capsys, ["train", "--parallel", "dp", "--device", "auto", "--out", str(tmp_path / "r")])
    assert f"needs at least 2 CUDA GPUs, found {torch.cuda.device_count()}" in line


def test_more_processes_than_gpus_is_a_hardware_error(monkeypatch):
    # Pretend to be a 1-GPU machine: --nproc 2 on CUDA must fail before torchrun starts.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(HardwareError, match=r"--nproc 2: only 1 CUDA device\(s\) visible"):
        check_launch("ddp", 2, "cuda", 128)
    check_launch("ddp", 2, "cpu", 128)  # processes on the CPU are not limited by GPUs


def test_worker_checks_batch_against_world_size_before_joining(monkeypatch):
    # A torchrun worker (no --nproc to check) must still refuse before init_process_group. A world size
    # that does not divide the batch is fine (uneven shards); one larger than the batch is not.
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="--batch-size 2 is smaller than the world size 3"):
        setup_data_parallel("ddp", "cpu", 2)
    check_launch("ring", 3, "cpu", 128)  # 43 + 43 + 42: accepted


def test_dataloader_path_refuses_several_ranks():
    from trainlab.data.mnist import load_mnist

    par = DataParallelContext(mode="ddp", rank=0, world_size=2)
    with pytest.raises(ConfigError, match="--loader dataloader"):
        build_train_batches(TrainConfig(**SMALL, loader="dataloader"), load_mnist(None), torch.device("cpu"), par)


def test_compare_rejects_unknown_modes_before_running(capsys):
    assert main(["dp", "compare", "--modes", "none,zero", "--device", "cpu"]) == 2
    assert "--modes: unknown mode 'zero'" in capsys.readouterr().err
    assert main(["dp", "compare", "--modes", "ddp", "--nproc", "3", "--batch-size", "2", "--device", "cpu"]) == 2
    assert "smaller than --nproc 3" in capsys.readouterr().err
    assert main(["dp", "compare", "--workers", "0,x", "--device", "cpu"]) == 2
    assert "--workers" in capsys.readouterr().err


def test_buckets_keep_order_and_respect_the_cap():
    params = list(LeNet5().parameters())
    cap = 16 * 1024  # bytes
    buckets = make_buckets(params, cap)
    assert [p for b in buckets for p in b] == params  # every parameter once, in order
    for b in buckets:
        size = sum(p.numel() * p.element_size() for p in b)
        assert size <= cap or len(b) == 1
    assert len(buckets) > 1
    assert len(make_buckets(params)) == 1  # LeNet-5's 247 KB fit the default 1 MiB bucket


def _losses(run_dir):
    return [x for line in (run_dir / "metrics.jsonl").read_text().splitlines() for x in json.loads(line)["step_losses"]]


@pytest.mark.parametrize("mode", ["ddp", "allreduce", "ring"])
def test_world_of_one_equals_the_plain_trainer(tmp_path, mode):
    ref = train(TrainConfig(**SMALL, out=str(tmp_path / "none")), log=quiet)
    got = train(TrainConfig(**SMALL, parallel=mode, out=str(tmp_path / mode)), log=quiet)
    assert got["parallel"] == mode and got["world_size"] == 1
    assert _losses(tmp_path / mode) == _losses(tmp_path / "none")
    assert got["test_loss"] == ref["test_loss"]
    import torch.distributed as dist

    assert not dist.is_initialized()  # the context destroyed the group it created


def test_step_timing_splits_every_step(tmp_path):
    s = train(TrainConfig(**SMALL, parallel="allreduce", out=str(tmp_path / "t"), step_timing=True), log=quiet)
    st = s["step_times"]
    assert st["steps"] == 6  # 384 / 64
    assert st["data_ms"]["median"] > 0 and st["compute_ms"]["median"] > st["data_ms"]["median"]
    assert st["comm_ms"]["max"] == 0  # world of one: nothing is communicated
    assert train(TrainConfig(**SMALL, out=str(tmp_path / "u")), log=quiet)["step_times"] is None


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["ddp", "allreduce", "ring"])
def test_world_of_one_on_cuda_matches_the_plain_trainer(tmp_path, mode):
    # NCCL group of one (ddp) / no group (allreduce) on the GPU: same run as `none` up to kernel nondeterminism.
    cuda = {**SMALL, "device": "cuda", "amp": "off", "channels_last": "off"}
    ref = train(TrainConfig(**cuda, out=str(tmp_path / "none")), log=quiet)
    got = train(TrainConfig(**cuda, parallel=mode, out=str(tmp_path / mode), step_timing=True), log=quiet)
    torch.testing.assert_close(
        torch.tensor(_losses(tmp_path / mode)), torch.tensor(_losses(tmp_path / "none")), rtol=1e-3, atol=1e-4
    )
    assert got["test_loss"] == pytest.approx(ref["test_loss"], rel=1e-3)
    assert got["step_times"]["steps"] == 6


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nn.DataParallel needs 2+ GPUs")
def test_dataparallel_matches_single_gpu(tmp_path):
    cuda = {**SMALL, "device": "cuda", "amp": "off", "channels_last": "off"}
    ref = train(TrainConfig(**cuda, out=str(tmp_path / "none")), log=quiet)
    got = train(TrainConfig(**cuda, parallel="dp", out=str(tmp_path / "dp")), log=quiet)
    torch.testing.assert_close(
        torch.tensor(_losses(tmp_path / "dp")), torch.tensor(_losses(tmp_path / "none")), rtol=1e-3, atol=1e-4
    )
    assert got["test_loss"] == pytest.approx(ref["test_loss"], rel=1e-3)


def test_scale_lr_rules_and_warmup():
    # --batch-size is the global batch: W ranks × b per rank scale the lr by W·b/128.
    from trainlab.lenet.plan import resolve
    from trainlab.lenet.setup import build_optimizer, build_scheduler, scaled_lr

    assert scaled_lr(TrainConfig(batch_size=512, lr=0.1, scale_lr="linear")) == pytest.approx(0.4)
    assert scaled_lr(TrainConfig(batch_size=512, lr=0.1, scale_lr="sqrt")) == pytest.approx(0.2)
    assert scaled_lr(TrainConfig(batch_size=512, lr=0.1, scale_lr="none")) == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="--scale-lr 'cubic'"):
        TrainConfig(scale_lr="cubic").validate()  # the one owner of the check (setup.py trusts it)
    cfg = TrainConfig(
        batch_size=512, lr=0.1, scale_lr="linear", schedule="cosine", warmup_epochs=1, epochs=3, optimizer="sgd"
    )
    model = LeNet5()
    plan = resolve(cfg, torch.device("cpu"))
    assert plan.lr == pytest.approx(scaled_lr(cfg))
    opt = build_optimizer(plan, model)
    sched = build_scheduler(plan, opt, plan.lr, steps_per_epoch=10)
    lrs = []
    for _ in range(30):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.4 / 10) and lrs[9] == pytest.approx(0.4)  # linear warm-up over one epoch
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10])) and lrs[-1] < 0.01  # then cosine decay
