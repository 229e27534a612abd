"""The `lightning` row of `trainlab dp compare` (lenet/lightning_row.py): PyTorch Lightning's Trainer with its
DDP strategy on 2 CPU processes, trainlab's model/optimizer/batches, beside trainlab's own `ddp` loop."""

from __future__ import annotations

import pytest

from trainlab.lenet import compare as compare_mod
from trainlab.lenet.compare import CompareConfig, compare, run_compare

TINY = dict(nproc=2, device="cpu", train_subset=512, test_subset=200, workers="", threads=1)


def test_without_lightning_the_row_says_so_and_the_rest_runs(monkeypatch, capsys):
    monkeypatch.setattr(
        compare_mod, "lightning_missing", lambda: "Lightning is not installed: pip install '.[lightning]'"
    )
    report = run_compare(CompareConfig(modes="lightning", **TINY), log=print)  # no error: skipped, not failed
    assert "| lightning | 2 | – | device | **skipped** |" in report
    assert "- lightning × 2: Lightning is not installed: pip install '.[lightning]'" in report


@pytest.mark.dist
def test_lightning_trains_the_same_model_to_the_same_accuracy_as_trainlabs_ddp():
    pytest.importorskip("lightning", reason="the optional extra: pip install '.[lightning]'")
    rows, _ = compare(CompareConfig(modes="ddp,lightning", **TINY), log=lambda *a: None)
    ddp, lit = rows
    assert lit["mode"] == "lightning" and lit["status"] == "ok" and lit["world_size"] == 2
    assert "Trainer.fit wall time" in lit["note"]
    # the same batches, weights, optimizer and schedule: the same trained model, to float rounding
    assert lit["test_accuracy"] == pytest.approx(ddp["test_accuracy"], abs=0.5)
    assert lit["test_loss"] == pytest.approx(ddp["test_loss"], rel=1e-3)
    assert lit["images_per_s"] > 0 and lit["epoch_seconds"] > 0
