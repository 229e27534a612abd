"""The LeNet-5 trainer on real (embedded) MNIST, small subsets unless stated."""

import json

import pytest
import torch

from trainlab.cli import main
from trainlab.lenet.config import TrainConfig, apply_preset
from trainlab.lenet.loop import train

SMALL = dict(epochs=1, train_subset=1024, test_subset=500, batch_size=128, device="cpu", progress=False)


def quiet(*_a, **_k):
    pass


def run(tmp_path, name, **kw):
    cfg = TrainConfig(**{**SMALL, "tensorboard": False, **kw, "out": str(tmp_path / name)})
    return train(cfg, log=quiet), tmp_path / name


def step_losses(run_dir):
    return [
        loss
        for rec in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        for loss in rec["step_losses"]
    ]


def test_same_seed_same_loss_curve_and_other_seed_differs(tmp_path):
    _, a = run(tmp_path, "a", seed=3)
    _, b = run(tmp_path, "b", seed=3)
    _, c = run(tmp_path, "c", seed=4)
    assert len(step_losses(a)) == 8
    assert step_losses(a) == step_losses(b)
    assert step_losses(a) != step_losses(c)


def test_dataloader_path_matches_device_path(tmp_path):
    # Same order, same normalization, no augmentation → the same batches → the same losses.
    _, dev = run(tmp_path, "dev", loader="device")
    _, dl = run(tmp_path, "dl", loader="dataloader", workers=0)
    torch.testing.assert_close(torch.tensor(step_losses(dl)), torch.tensor(step_losses(dev)), rtol=1e-6, atol=1e-6)


def test_resume_equals_uninterrupted(tmp_path):
    full, full_dir = run(tmp_path, "full", epochs=3)
    partial, part_dir = run(tmp_path, "part", epochs=3, stop_after=1)
    assert partial["interrupted"] and partial["epochs_done"] == 1
    cfg = TrainConfig.from_dict(json.loads((part_dir / "config.json").read_text()))
    cfg.stop_after = None
    resumed = train(cfg, resume=part_dir, log=quiet)
    assert resumed["test_accuracy"] == full["test_accuracy"]
    assert resumed["test_loss"] == full["test_loss"]
    assert step_losses(part_dir) == step_losses(full_dir)
    a = torch.load(full_dir / "checkpoint.pt", weights_only=True)["model"]  # checkpoints are data only
    b = torch.load(part_dir / "checkpoint.pt", weights_only=True)["model"]
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_resume_with_more_epochs_rebuilds_the_schedule_and_a_plain_resume_still_works(tmp_path, capsys):
    """`--resume DIR --epochs 5` on a 3-epoch run used to crash in OneCycleLR after two epochs and to
    leave a config.json that crashed every later plain --resume too."""
    from trainlab.lenet.plan import resolve
    from trainlab.lenet.setup import build_optimizer, build_scheduler

    _, d = run(tmp_path, "x", epochs=3, stop_after=3)  # a finished 3-epoch run (8 steps per epoch)
    base = ["--device", "cpu", "--no-progress", "--no-tensorboard"]
    assert main(["train", "--resume", str(d), "--epochs", "5", "--stop-after", "1", *base]) == 0
    assert "the LR schedule is rebuilt for 5 epochs (40 steps) and continues at step 24" in capsys.readouterr().out
    assert json.loads((d / "config.json").read_text())["epochs"] == 5
    assert main(["train", "--resume", str(d), *base]) == 0  # plain resume of the extended run: epoch 5
    records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5]
    # The LR after each epoch is the 5-epoch OneCycle's at that step (the first 3 epochs ran the 3-epoch one).
    cfg = TrainConfig(**{**SMALL, "epochs": 5})
    plan = resolve(cfg, torch.device("cpu"))
    sched = build_scheduler(plan, build_optimizer(plan, torch.nn.Linear(1, 1)), plan.lr, 8)
    expected = []
    for _ in range(40):
        sched.optimizer.step()
        sched.step()
        expected.append(sched.get_last_lr()[0])
    assert [r["lr"] for r in records[3:]] == pytest.approx([expected[31], expected[39]], rel=1e-12)
    assert records[-1]["lr"] < records[2]["lr"] * 10  # annealed to the end again, not restarted


def test_run_directory_and_summary(tmp_path):
    summary, d = run(tmp_path, "s", epochs=2)
    for f in ("config.json", "env.json", "metrics.jsonl", "checkpoint.pt", "summary.json"):
        assert (d / f).exists(), f
    on_disk = json.loads((d / "summary.json").read_text())
    assert on_disk["test_accuracy"] == summary["test_accuracy"]
    assert on_disk["epochs"] == 2 and on_disk["params"] == 61_706 and on_disk["device"] == "cpu"
    assert len(on_disk["per_class_accuracy"]) == 10
    cm = torch.tensor(on_disk["confusion_matrix"])
    assert cm.shape == (10, 10) and int(cm.sum()) == 500
    assert on_disk["test_accuracy"] == pytest.approx(100.0 * int(cm.diag().sum()) / 500)
    assert on_disk["train_seconds"] > 0
    env = json.loads((d / "env.json").read_text())
    assert env["torch"] == torch.__version__


def test_tensorboard_tags_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, d = run(tmp_path, "tb", epochs=2, tensorboard=True)
    acc = EventAccumulator(str(d), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    expected = {
        "train/loss",
        "train/lr",
        "test/loss",
        "test/accuracy",
        "perf/images_per_s",
        "train/accuracy",
        "train/accuracy_epoch",
        "train/loss_epoch",
    }
    expected |= {f"test/class_accuracy/{c}" for c in range(10)}
    assert expected <= scalars
    assert len(acc.Scalars("train/loss")) == 16  # 8 steps per epoch × 2 epochs
    assert len(acc.Scalars("train/accuracy")) == 16
    summary = json.loads((d / "summary.json").read_text())
    records = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert acc.Scalars("test/accuracy")[-1].value == pytest.approx(summary["test_accuracy"], rel=1e-6)
    assert [e.value for e in acc.Scalars("train/accuracy_epoch")] == pytest.approx(
        [r["train_accuracy"] for r in records]
    )
    assert {"layers/conv1_filters", "layers/conv1_feature_maps", "test/misclassified"} <= set(acc.Tags()["images"])


def test_train_accuracy_is_the_batches_accuracy_before_each_update(tmp_path):
    # Independent reference: the initial model (same seed) on the first training batch (same order).
    from trainlab.data.loader import DeviceLoader
    from trainlab.data.mnist import load_mnist
    from trainlab.lenet.plan import resolve
    from trainlab.lenet.setup import build_model

    summary, d = run(tmp_path, "acc", epochs=1)
    record = json.loads((d / "metrics.jsonl").read_text().splitlines()[0])
    cfg = TrainConfig(**SMALL)
    data = load_mnist(None)
    loader = DeviceLoader(data.train_images[:1024], data.train_labels[:1024], 128, "cpu", seed=cfg.seed)
    loader.set_epoch(0)
    x, y = next(iter(loader))
    model = build_model(resolve(cfg, torch.device("cpu"))).train()
    with torch.no_grad():
        first = 100.0 * (model(x).argmax(1) == y).sum().item() / len(y)
    assert record["step_accuracies"][0] == pytest.approx(first)
    assert len(record["step_accuracies"]) == 8
    # the epoch figure is the mean over steps weighted by batch size (here all batches have 128 images)
    assert record["train_accuracy"] == pytest.approx(sum(record["step_accuracies"]) / 8)
    assert summary["train_accuracy"] == record["train_accuracy"]


def test_misclassified_images_are_the_ones_the_checkpoint_gets_wrong(tmp_path):
    import numpy as np

    from trainlab.data.loader import DeviceLoader
    from trainlab.data.mnist import load_mnist
    from trainlab.lenet.plan import resolve
    from trainlab.lenet.setup import build_model

    summary, d = run(tmp_path, "wrong", epochs=1)
    z = np.load(d / "misclassified.npz")
    cm = torch.tensor(summary["confusion_matrix"])
    assert int(z["total"]) == int(cm.sum() - cm.diag().sum()) and int(z["tested"]) == 500
    cfg = TrainConfig(**SMALL)
    model = build_model(resolve(cfg, torch.device("cpu")))
    model.load_state_dict(torch.load(d / "checkpoint.pt", weights_only=False)["model"])
    data = load_mnist(None)
    x, y = next(iter(DeviceLoader(data.test_images[:500], data.test_labels[:500], 500, "cpu", shuffle=False)))
    with torch.no_grad():
        pred = model.eval()(x).argmax(1)
    wrong = (pred != y).nonzero().flatten()[:36]
    assert z["index"].tolist() == wrong.tolist()
    assert z["predicted"].tolist() == pred[wrong].tolist() and z["label"].tolist() == y[wrong].tolist()
    assert np.array_equal(z["image"], data.test_images[wrong.numpy()])  # raw pixels, for the report


def test_real_mnist_reaches_98_percent_and_eval_reproduces_it(tmp_path, capsys):
    """The acceptance bar of the handout (≥98%) on the full 60k/10k, inside the suite: the `fast` preset's one
    epoch (≈ 30 s on the 2-core box; the default recipe's two epochs took 5x that)."""
    cfg = apply_preset(TrainConfig(device="cpu", progress=False, tensorboard=False, out=str(tmp_path / "real")), "fast")
    summary = train(cfg, log=quiet)
    assert summary["test_accuracy"] >= 98.0
    assert main(["eval", str(tmp_path / "real"), "--device", "cpu", "--json", "-"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    assert evaluated["test_samples"] == 10_000


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["train", "--optimizer", "lion"], "--optimizer 'lion'"),
        (["train", "--loader", "magic"], "--loader 'magic'"),
        (["train", "--act", "swishy"], "--act 'swishy'"),
        (["train", "--schedule", "steps"], "--schedule 'steps'"),
        (["train", "--epochs", "0"], "--epochs"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, capsys, argv, needle):
    assert main(argv + ["--out", str(tmp_path / "x"), "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainlab: error:") and needle in err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_without_gpu_is_a_clear_error(tmp_path, capsys):
    assert main(["train", "--device", "cuda", "--out", str(tmp_path / "x")]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_eval_of_a_corrupt_checkpoint_names_the_file(tmp_path, capsys):
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes(b"not a checkpoint")
    assert main(["eval", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not a readable checkpoint" in err
    assert main(["train", "--resume", str(tmp_path / "nowhere")]) == 2
