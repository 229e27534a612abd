"""`trainlab train` (and so `make train`) says what it will do before it trains: device, epochs, sizes and
an estimate measured on the run's own step — and measuring it leaves the run exactly as it was."""

import json
import re

from trainlab.lenet import estimate
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train

SMALL = dict(epochs=2, train_subset=640, test_subset=300, batch_size=128, device="cpu", progress=False)


def _run(tmp_path, name, **kw):
    lines = []
    cfg = TrainConfig(**{**SMALL, "tensorboard": False, **kw, "out": str(tmp_path / name)})
    train(cfg, log=lines.append)
    metrics = [json.loads(r) for r in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return lines, [loss for rec in metrics for loss in rec["step_losses"]]


def test_the_plan_line_comes_before_the_first_epoch_with_its_numbers(tmp_path):
    lines, _ = _run(tmp_path, "a")
    plan = [i for i, line in enumerate(lines) if line.startswith("plan: ")]
    first_epoch = next(i for i, line in enumerate(lines) if line.startswith("epoch "))
    assert len(plan) == 1 and plan[0] < first_epoch, lines
    line = lines[plan[0]]
    assert line.startswith("plan: 2 epochs on cpu: 640 train images (10 steps of 128), 300 test images"), line
    ms = float(re.search(r"\(([\d.]+) ms per step, timed on this machine just now over 3 steps", line).group(1))
    assert ms > 0 and "estimate ≈ " in line


def test_calibrating_changes_nothing_the_run_computes(tmp_path, monkeypatch):
    # BatchNorm statistics, augmentation draws, AdamW state: the calibration's steps must leave no trace
    kw = dict(batchnorm=True, augment=True, seed=5)
    _, calibrated = _run(tmp_path, "a", **kw)
    monkeypatch.setattr(estimate, "calibrate_step", lambda *a, **k: None)
    lines, plain = _run(tmp_path, "b", **kw)
    assert calibrated == plain and len(plain) == 10
    assert any("estimate: none before training" in line for line in lines)


def test_the_plan_line_of_a_resumed_run_counts_the_epochs_left():
    line = estimate.plan_line("cpu", 5, 3, 60000, 10000, 470, 256, 0.5)
    assert line.startswith("plan: 2 epochs (epochs 4-5, resumed) on cpu: 60,000 train images (470 steps of 256)")
    assert "estimate ≈ 3.9 min of training steps (500.0 ms per step" in line
