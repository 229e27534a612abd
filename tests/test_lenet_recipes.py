"""The accuracy recipe's parts: EMA of the weights (formula, resume, eval), test-time augmentation, flags."""

import json

import numpy as np
import pytest
import torch
import torch.nn as nn

from trainlab.cli import main
from trainlab.data.mnist import BACKGROUND, load_mnist
from trainlab.lenet.batches import build_test_batches
from trainlab.lenet.config import PRESETS, TrainConfig
from trainlab.lenet.ema import EMA
from trainlab.lenet.evaluate import evaluate
from trainlab.lenet.loop import train
from trainlab.lenet.model import LeNet5, count_parameters
from trainlab.lenet.tta import evaluate_tta, shifted

SMALL = dict(
    epochs=1, train_subset=512, test_subset=500, batch_size=128, device="cpu", progress=False, tensorboard=False
)


def quiet(*_a, **_k):
    pass


# ----------------------------------------------------------------------------- EMA


@pytest.mark.parametrize("warmup", [10, 1, 4])
def test_ema_follows_the_formula_with_its_warm_up_ramp(warmup):
    """d_t = min(decay, (1 + t)/(N + t)), N = --ema-warmup: 10 (the default) and 1 (a mean of every weight
    so far until the decay is reached) both cross the cap of 0.9 within the 30 updates."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    ema = EMA(model, decay=0.9, warmup=warmup)
    expected = {k: v.double().clone() for k, v in model.state_dict().items()}
    for t in range(30):
        with torch.no_grad():  # the "optimizer step": new live weights and BatchNorm statistics
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model(torch.randn(8, 3))
        d = min(0.9, (1 + t) / (warmup + t))
        assert ema.current_decay() == pytest.approx(d)
        ema.update()
        for k, live in model.state_dict().items():
            if live.dtype.is_floating_point:
                expected[k] = d * expected[k] + (1 - d) * live.double()
            else:
                expected[k] = live.double()
    assert ema.updates == 30
    for k, v in ema.module.state_dict().items():
        torch.testing.assert_close(v.double(), expected[k], rtol=1e-5, atol=1e-6, msg=k)
    assert int(ema.module.state_dict()["1.num_batches_tracked"]) == 30  # integer buffers copied, not averaged
    assert not any(p.requires_grad for p in ema.module.parameters())


def test_ema_state_dict_round_trip_continues_identically():
    torch.manual_seed(1)
    model = nn.Linear(4, 4)
    a = EMA(model, decay=0.99)
    for _ in range(5):
        with torch.no_grad():
            model.weight.add_(1.0)
        a.update()
    b = EMA(nn.Linear(4, 4), decay=0.5)
    b.source = model
    b.load_state_dict(a.state_dict())
    assert b.decay == 0.99 and b.updates == 5
    with torch.no_grad():
        model.weight.mul_(-2)
    a.update()
    b.update()
    assert torch.equal(a.module.weight, b.module.weight)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5])
def test_ema_rejects_decays_outside_0_1(decay):
    with pytest.raises(ValueError, match="decay"):
        EMA(nn.Linear(2, 2), decay)


def test_ema_warmup_reaches_the_runs_average(tmp_path):
    """--ema-warmup 1 over a run shorter than the cap (4 steps, decay 0.95): the EMA is the plain mean of
    the initial weights and the 4 after each step, so it differs from N = 10's, which weighs the latest most."""
    runs = {}
    for n in (1, 10):
        cfg = TrainConfig(**dict(SMALL, ema=0.95, ema_warmup=n, test_subset=100), out=str(tmp_path / f"n{n}"))
        train(cfg, log=quiet)
        runs[n] = torch.load(tmp_path / f"n{n}" / "checkpoint.pt", weights_only=False)
    assert all(torch.equal(runs[1]["model"][k], runs[10]["model"][k]) for k in runs[1]["model"])  # same training
    w1, w10, live = (runs[1]["ema"]["model"], runs[10]["ema"]["model"], runs[1]["model"])
    key = "classifier.7.weight"  # fc3 of the plain LeNet-5
    # N = 1: d_t = (1+t)/(2+t) → after 4 updates every state weighs 1/5, the last one included; N = 10:
    # d_3 = 4/13, so the last live weights weigh 9/13
    assert not torch.allclose(w1[key], w10[key])
    assert (w10[key] - live[key]).abs().sum() < (w1[key] - live[key]).abs().sum()


def test_resume_with_ema_equals_uninterrupted(tmp_path):
    kw = dict(SMALL, epochs=2, ema=0.9, batchnorm=True, augment=True, elastic_alpha=34.0, test_subset=200)
    full = train(TrainConfig(**kw, out=str(tmp_path / "full")), log=quiet)
    part = train(TrainConfig(**kw, stop_after=1, out=str(tmp_path / "part")), log=quiet)
    assert part["interrupted"]
    resumed = train(TrainConfig(**kw, out=str(tmp_path / "part")), resume=tmp_path / "part", log=quiet)
    assert resumed["test_accuracy"] == full["test_accuracy"] and resumed["test_loss"] == full["test_loss"]
    a, b = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=False) for d in ("full", "part"))
    assert a["ema"]["updates"] == b["ema"]["updates"] == 2 * 4
    for k in a["ema"]["model"]:
        assert torch.equal(a["ema"]["model"][k], b["ema"]["model"][k]), k
    records = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert all("live_test_accuracy" in r for r in records)


def test_the_ema_weights_are_what_is_reported_and_what_eval_reloads(tmp_path, capsys):
    summary = train(TrainConfig(**dict(SMALL, epochs=2, ema=0.95, tta=True), out=str(tmp_path / "r")), log=quiet)
    assert 0 < summary["tta_test_accuracy"] <= 100  # reported beside test_accuracy, which is checked below
    ckpt = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=False)
    live_differs = any(not torch.equal(ckpt["model"][k], ckpt["ema"]["model"][k]) for k in ckpt["model"])
    assert live_differs and summary["ema_decay"] == 0.95
    assert main(["eval", str(tmp_path / "r"), "--device", "cpu", "--json", "-"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["weights"] == "ema"
    # eval tests all 10,000 images; recompute the reported number on the run's 500 with the EMA weights
    # (so TTA, reported separately, did not leak into test_accuracy).
    model = LeNet5()
    model.load_state_dict(ckpt["ema"]["model"])
    batches = build_test_batches(TrainConfig(**SMALL), load_mnist(), torch.device("cpu"))
    assert evaluate(model, batches, torch.device("cpu"))["test_accuracy"] == summary["test_accuracy"]


# ----------------------------------------------------------------------------- TTA


def test_shifted_view_is_a_roll_with_background_fill():
    x = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    right = torch.full_like(x, BACKGROUND)
    right[..., :, 1:] = x[..., :, :-1]
    up = torch.full_like(x, BACKGROUND)
    up[..., :-1, :] = x[..., 1:, :]
    torch.testing.assert_close(shifted(x, 1, 0), right, rtol=0, atol=1e-5)
    torch.testing.assert_close(shifted(x, 0, -1), up, rtol=0, atol=1e-5)
    assert shifted(x, 0, 0) is x


def test_tta_averages_softmax_over_the_views():
    torch.manual_seed(0)
    model = LeNet5().eval()
    x = torch.randn(64, 1, 28, 28)
    y = torch.randint(0, 10, (64,))
    batches = [(x[:40], y[:40]), (x[40:], y[40:])]
    cpu = torch.device("cpu")
    one_view = evaluate_tta(model, batches, cpu, shifts=((0, 0),))
    assert one_view["test_accuracy"] == evaluate(model, batches, cpu)["test_accuracy"] and one_view["views"] == 1
    shifts = ((0, 0), (1, 0), (0, -1))
    with torch.no_grad():
        probs = sum(model(shifted(x, dx, dy)).softmax(1) for dx, dy in shifts)
    expected = 100.0 * float((probs.argmax(1) == y).float().mean())
    assert evaluate_tta(model, batches, cpu, shifts=shifts)["test_accuracy"] == pytest.approx(expected)


# ----------------------------------------------------------------------------- presets and flags


@pytest.mark.parametrize("batchnorm_conv1, bn_layers", [(True, (6, 16, 120, 84)), (False, (16, 120, 84))])
def test_batchnorm_variants_are_lenet5_plus_named_batchnorm(batchnorm_conv1, bn_layers):
    model = LeNet5(batchnorm=True, batchnorm_conv1=batchnorm_conv1)
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert [m.num_features for m in bns] == list(bn_layers)
    # Each BatchNorm adds a scale and a shift per channel and makes the preceding layer's bias redundant.
    assert count_parameters(model) == 61_706 + 2 * sum(bn_layers) - sum(bn_layers)
    assert (model.conv1.bias is None) == batchnorm_conv1
    assert count_parameters(LeNet5()) == 61_706


def test_presets_keep_lenet5():
    for name, preset in PRESETS.items():
        cfg = TrainConfig(**preset)
        model = LeNet5(act=cfg.act, pool=cfg.pool, batchnorm=cfg.batchnorm, batchnorm_conv1=cfg.batchnorm_conv1)
        convs_and_fcs = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        assert [tuple(m.weight.shape) for m in convs_and_fcs] == [
            (6, 1, 5, 5),
            (16, 6, 5, 5),
            (120, 400),
            (84, 120),
            (10, 84),
        ], name


def test_presets_resolve_and_explicit_flags_win():
    import argparse

    from trainlab.flags import add_flags
    from trainlab.lenet.cli import config_from_args

    parser = argparse.ArgumentParser()
    add_flags(parser, TrainConfig)
    fast = config_from_args(parser.parse_args(["--preset", "fast", "--epochs", "3"]))
    assert fast.preset == "fast" and fast.epochs == 3  # the explicit flag wins over the preset
    assert (fast.batchnorm, fast.batchnorm_conv1, fast.amp, fast.channels_last, fast.label_smoothing, fast.lr) == (
        True,
        False,
        "bf16",
        "on",
        0.1,
        3.5e-2,
    )
    assert (fast.batch_size, fast.pool, fast.schedule, fast.warmup_epochs) == (192, "avg", "linear", 0.3)  # linear to 0
    assert config_from_args(parser.parse_args(["--preset", "fast"])).epochs == 1
    best = config_from_args(parser.parse_args(["--preset", "best"]))
    for key, value in PRESETS["best"].items():
        assert getattr(best, key) == value, key
    assert best.ema > 0 and best.augment  # the accuracy recipe: averaged weights, augmentation


@pytest.mark.parametrize("units", [True, False], ids=["bf16-units", "avx2-only"])
def test_fast_preset_trains_in_bf16_on_a_cpu_with_bf16_units_else_fp32(tmp_path, monkeypatch, units):
    from trainlab.lenet.config import apply_preset

    monkeypatch.setattr("trainlab.lenet.plan.cpu_has_bf16", lambda: units)  # (emulated where it has none)
    cfg = apply_preset(TrainConfig(**dict(SMALL, out=str(tmp_path / "f"))), "fast", explicit={"epochs"})
    summary = train(cfg, log=quiet)
    # LeNet-5 + BatchNorm after conv2, fc1, fc2 (scale and shift per channel; their layers' biases dropped)
    assert summary["epochs"] == 1 and summary["params"] == 61_706 + (16 + 120 + 84) == 61_926
    assert (summary["amp"], summary["channels_last"]) == ("bfloat16" if units else "off", True)
    assert 10.0 < summary["test_accuracy"] <= 100.0


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--ema", "1.5"], "--ema 1.5"),
        (["--ema", "nan"], "--ema nan"),
        (["--elastic-alpha", "-3"], "--elastic-alpha -3"),
        (["--elastic-sigma", "0"], "--elastic-sigma 0"),
        (["--augment-degrees", "200"], "--augment-degrees 200"),
    ],
)
def test_bad_recipe_flags_are_one_line_errors(tmp_path, capsys, argv, needle):
    assert main(["train", *argv, "--out", str(tmp_path / "x"), "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainlab: error:") and needle in err[0]
    assert not (tmp_path / "x").exists()  # refused before the run directory or the data


# ----------------------------------------------------------------------------- one-epoch recipe: schedule, validation split


def test_linear_schedule_warms_up_then_decays_to_zero():
    from trainlab.lenet.plan import resolve
    from trainlab.lenet.setup import build_scheduler

    cfg = TrainConfig(schedule="linear", warmup_epochs=0.2, epochs=1, lr=1.0)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = build_scheduler(resolve(cfg, torch.device("cpu")), opt, 1.0, steps_per_epoch=10)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # 2 warm-up steps (0.2 × 10) up to the peak, then (10 − s) / 8 down to 0 after the last step
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8])
    assert opt.param_groups[0]["lr"] == 0.0


def test_holdout_trains_on_the_rest_and_scores_the_held_out_training_images(tmp_path):
    data = load_mnist()
    split = data.holdout(1000)
    assert len(split.train_labels) == 59_000 and len(split.test_labels) == 1000
    assert np_equal(split.train_images, data.train_images[:59_000]) and np_equal(
        split.test_images, data.train_images[59_000:]
    )
    assert np_equal(split.test_labels, data.train_labels[59_000:])
    summary = train(TrainConfig(**dict(SMALL, test_subset=None, holdout=300, out=str(tmp_path / "h"))), log=quiet)
    # scored on the 300 held-out training images (the confusion matrix counts them), not on test images
    assert sum(map(sum, summary["confusion_matrix"])) == 300
    wrong = np.load(tmp_path / "h" / "misclassified.npz")
    held_out = data.holdout(300)
    assert int(wrong["tested"]) == 300 and len(wrong["index"]) > 0
    assert np_equal(wrong["image"], held_out.test_images[wrong["index"]])
    assert np_equal(wrong["label"], held_out.test_labels[wrong["index"]].astype(np.int64))


def np_equal(a, b) -> bool:
    return bool((a == b).all()) and a.shape == b.shape


@pytest.mark.parametrize("n", [60_000, 70_000])
def test_holdout_of_the_whole_training_set_is_a_one_line_error(tmp_path, capsys, n):
    assert main(["train", "--holdout", str(n), "--out", str(tmp_path / "x"), "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--holdout {n}: expected fewer than the 60000 training images" in err[0]


# ----------------------------------------------------------------------------- batch-size warm-up


def test_batch_warmup_serves_small_batches_first_and_every_image_once_per_epoch():
    from trainlab.data.loader import DeviceLoader

    n = 1000
    index = torch.arange(n)  # as the labels: each batch says which images it holds
    images = torch.zeros(n, 28, 28, dtype=torch.uint8)
    loader = DeviceLoader(images, index, 256, "cpu", seed=3, warmup_batch_size=64, warmup_images=300)
    plain = DeviceLoader(images, index, 256, "cpu", seed=3)
    assert loader.total_steps(2) == 8 + 4 and loader.total_steps(1) == 8
    for epoch, sizes in ((0, [64] * 5 + [256, 256, 168]), (1, [256, 256, 256, 232])):
        loader.set_epoch(epoch)
        plain.set_epoch(epoch)
        batches = [y for _, y in loader]
        assert [len(y) for y in batches] == sizes and len(loader) == len(sizes)
        # each image exactly once, in the epoch's shuffled order: the same order as without the warm-up
        assert torch.equal(torch.cat(batches), torch.cat([y for _, y in plain]))
        assert sorted(torch.cat(batches).tolist()) == list(range(n))


def test_batch_warmup_over_the_whole_epoch_is_exactly_the_small_batch_run(tmp_path):
    kw = dict(SMALL, train_subset=640, schedule="linear", warmup_epochs=0.2, label_smoothing=0.1, batchnorm=True)
    small = train(TrainConfig(**dict(kw, batch_size=64), out=str(tmp_path / "small")), log=quiet)
    warm = train(
        TrainConfig(
            **dict(kw, batch_size=256, warmup_batch_size=64, batch_warmup_epochs=1.0), out=str(tmp_path / "warm")
        ),
        log=quiet,
    )
    a, b = (json.loads((tmp_path / d / "metrics.jsonl").read_text().splitlines()[0]) for d in ("small", "warm"))
    assert len(a["step_losses"]) == 10 and a["step_losses"] == b["step_losses"]
    assert small["test_accuracy"] == warm["test_accuracy"] and small["test_loss"] == warm["test_loss"]


def test_batch_warmup_schedule_spans_all_steps_and_resume_continues_it(tmp_path):
    # 640 images, a quarter in batches of 32 (5 steps), the rest in batches of 128 (4 steps) in epoch 0;
    # then 5 steps of 128 per epoch. The linear schedule reaches 0 exactly at the last step.
    kw = dict(
        SMALL,
        epochs=2,
        train_subset=640,
        batch_size=128,
        warmup_batch_size=32,
        batch_warmup_epochs=0.25,
        schedule="linear",
        warmup_epochs=0.2,
    )
    full = train(TrainConfig(**kw, out=str(tmp_path / "full")), log=quiet)
    records = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in records] == [9, 14] and [len(r["step_losses"]) for r in records] == [9, 5]
    assert records[-1]["lr"] == 0.0
    train(TrainConfig(**kw, stop_after=1, out=str(tmp_path / "part")), log=quiet)
    resumed = train(TrainConfig(**kw, out=str(tmp_path / "part")), resume=tmp_path / "part", log=quiet)
    assert resumed["test_accuracy"] == full["test_accuracy"] and resumed["test_loss"] == full["test_loss"]
