"""`trainlab dp compare` end to end: single process in-process, ddp as 2 ranks under torchrun."""

import json

import pytest

from trainlab.cli import main

pytestmark = pytest.mark.dist


def test_compare_writes_the_contract_rows_and_modes_agree(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    argv = [
        "dp",
        "compare",
        "--modes",
        "none,ddp,ring",
        "--nproc",
        "2",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--train-subset",
        "512",
        "--test-subset",
        "200",
        "--batch-size",
        "64",
        "--workers",
        "0",
        "--json",
        str(out),
        "--md",
        str(tmp_path / "cmp.md"),
    ]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "dp_compare" and doc["plan"]["dataset"]["train"] == 512
    rows = doc["rows"]
    assert [r["mode"] for r in rows] == ["none", "ddp", "ring"]
    assert [r["world_size"] for r in rows] == [1, 2, 2]
    for r in rows:
        for key in (
            "mode",
            "world_size",
            "epoch_seconds",
            "images_per_s",
            "test_accuracy",
            "data_ms",
            "compute_ms",
            "comm_ms",
        ):
            assert r[key] is not None, key
        assert r["epoch_seconds"] > 0
        assert r["images_per_s"] == pytest.approx(512 / r["epoch_seconds"], rel=1e-6)
        assert r["steps"] == 8 and r["global_batch"] == 64
    # Same global batches, same order → the same model up to float rounding → the same predictions.
    assert abs(rows[0]["test_accuracy"] - rows[1]["test_accuracy"]) <= 0.5  # ≤ 1 of 200 test images
    assert rows[0]["test_loss"] == pytest.approx(rows[1]["test_loss"], rel=1e-3)
    assert rows[0]["comm_ms"] == 0 and rows[1]["comm_ms"] > 0 and rows[1]["comm_overlapped"]
    assert rows[2]["test_loss"] == pytest.approx(rows[0]["test_loss"], rel=1e-3)  # the ring trains the same model
    # bus bandwidth against the 2(W-1)/W bound: the ring sends exactly 2(W-1)/W of the gradient bytes
    ring = rows[2]
    assert ring["grad_bytes"] == 61_706 * 4 and ring["bytes_sent_per_step"] == ring["grad_bytes"]  # W = 2: factor 1
    assert ring["busbw_gbps"] == pytest.approx(ring["grad_bytes"] / ring["allreduce_ms"] * 1e3 / 1e9)
    assert ring["bound_comm_ms"] == pytest.approx(ring["grad_bytes"] / (ring["link_gbps"] * 1e9) * 1e3)
    assert ring["busbw_pct_of_link"] == pytest.approx(100 * ring["busbw_gbps"] / ring["link_gbps"])
    assert rows[1]["busbw_gbps"] > 0 and rows[0]["busbw_gbps"] is None
    sweep = json.loads((tmp_path / "cmp.loaders.json").read_text())["rows"]
    assert [(r["loader"], r["workers"]) for r in sweep] == [("device", None), ("dataloader", 0)]
    assert sweep[1]["test_loss"] == pytest.approx(sweep[0]["test_loss"], rel=1e-5)  # same batches via the DataLoader
    md = (tmp_path / "cmp.md").read_text()
    assert "| ddp | 2 |" in md and "num_workers sweep" in md and "| ring | 2 | 246,824 | 246,824 |" in md


def test_train_resume_relaunches_under_torchrun(tmp_path):
    # Interrupted after epoch 1 (in-process, world of one), resumed by `trainlab train --resume --nproc 2`:
    # the saved config is reused, rebuilt into each worker's command line, and epoch 1 is kept as it was.
    from trainlab.lenet.config import TrainConfig
    from trainlab.lenet.loop import train

    run = tmp_path / "run"
    cfg = TrainConfig(
        epochs=2,
        train_subset=256,
        test_subset=100,
        batch_size=64,
        device="cpu",
        parallel="ddp",
        progress=False,
        tensorboard=False,
        gpu_telemetry=False,
        stop_after=1,
        out=str(run),
    )
    assert train(cfg, log=lambda *a: None)["interrupted"]
    first = (run / "metrics.jsonl").read_text().splitlines()
    assert main(["train", "--resume", str(run), "--nproc", "2"]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2] and json.loads(first[0]) == records[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["parallel"] == "ddp" and summary["epochs"] == 2


def test_train_ring_on_three_ranks_with_uneven_shards_from_the_cli(tmp_path, capfd):
    # 64 images over 3 ranks: 21, 21, 22 — accepted, weighted, and the run directory says ring × 3.
    run = tmp_path / "ring3"
    assert (
        main(
            [
                "train",
                "--parallel",
                "ring",
                "--nproc",
                "3",
                "--device",
                "cpu",
                "--epochs",
                "1",
                "--train-subset",
                "300",
                "--test-subset",
                "100",
                "--batch-size",
                "64",
                "--no-progress",
                "--no-tensorboard",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 3 and summary["parallel"] == "ring"
    assert int(sum(map(sum, summary["confusion_matrix"]))) == 100  # the sharded test set, gathered whole
    out = capfd.readouterr().out
    assert "21, 21, 22" in out and "train_acc" in out
