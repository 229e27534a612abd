"""`--matmul-precision highest|high|medium` beside `--tf32 on|off` (device.matmul_precision, the one helper
LeNet and GPT share): the plan resolves the pair, the run applies it and records torch's own state."""

from __future__ import annotations

import pytest
import torch

from trainlab.device import set_matmul_precision
from trainlab.errors import ConfigError
from trainlab.hardware import matmul_precision
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train
from trainlab.lenet.plan import resolve


@pytest.fixture(autouse=True)
def _restore_precision():
    before, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    set_matmul_precision(before)
    torch.backends.cudnn.allow_tf32 = cudnn


@pytest.mark.parametrize(
    "tf32, precision, want",
    [("off", None, "highest"), ("on", None, "high"), ("off", "medium", "medium"), ("on", "medium", "medium")],
)
def test_the_pair_resolves_to_one_precision(tf32, precision, want):
    assert matmul_precision(tf32, precision) == want
    plan = resolve(TrainConfig(tf32=tf32, matmul_precision=precision, device="cpu"), torch.device("cpu"))
    assert plan.matmul_precision == want and plan.tf32 == (want != "highest")


def test_contradictions_and_unknown_values_are_refused():
    with pytest.raises(ConfigError, match=r"--matmul-precision highest: conflicts with --tf32 on"):
        TrainConfig(tf32="on", matmul_precision="highest").validate()
    with pytest.raises(ConfigError, match=r"--matmul-precision 'low': expected one of highest, high, medium"):
        TrainConfig(matmul_precision="low").validate()


def test_set_applies_torch_switches():
    state = set_matmul_precision("medium")
    assert state["float32_matmul_precision"] == "medium" and state["matmul_allow_tf32"] and state["cudnn_allow_tf32"]
    state = set_matmul_precision("highest")
    assert state == {"float32_matmul_precision": "highest", "matmul_allow_tf32": False, "cudnn_allow_tf32": False}


def test_a_run_records_the_precision_it_ran_with(tmp_path):
    cfg = TrainConfig(
        matmul_precision="high",
        epochs=1,
        train_subset=64,
        test_subset=64,
        batch_size=32,
        device="cpu",
        progress=False,
        tensorboard=False,
        gpu_telemetry=False,
        out=str(tmp_path / "run"),
    )
    s = train(cfg, log=lambda *a: None)
    assert s["tf32"]["float32_matmul_precision"] == "high" and s["plan"]["matmul_precision"] == "high"
