"""The `lightning` row of `trainlab dp compare`: LeNet-5 trained by PyTorch Lightning's Trainer (its DDP
strategy, one process per rank under torchrun) beside trainlab's own loop (the `ddp` row).

Only the driver differs: the model (`build_model`), the optimizer and the schedule (`build_optimizer`,
`build_scheduler`, stepped per optimizer step), the loss (cross-entropy with the recipe's label
smoothing) and the batches (the device loader, each rank its shard of the same global batches in the
same order) are trainlab's, so the accuracy should match the `ddp` row's and the time shows what
Lightning's loop, hooks and DDP wrapper cost or save. The time is `Trainer.fit`'s wall time, Lightning's
own set-up included (it is part of what a user of Lightning pays); the test accuracy is trainlab's
`evaluate` of the trained weights on rank 0.

Lightning is an optional extra (`pip install '.[lightning]'`); without it the row says so in one line
and the other modes still run (`lightning_missing`).
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from trainlab.io import atomic_write_json

INSTALL = "pip install '.[lightning]'"


def lightning_missing() -> str | None:
    """Why the Lightning row cannot run here (None: it can)."""
    try:
        import lightning  # noqa: F401
    except ImportError:
        return f"Lightning is not installed: {INSTALL} (the lightning package, 2.6)"
    return None


def run_lightning_worker(spec: dict) -> int:
    """One torchrun rank of the Lightning row; rank 0 writes the row to `spec["result"]`."""
    import lightning as L

    from trainlab.data.datasets import load_dataset
    from trainlab.device import resolve_device
    from trainlab.lenet.batches import build_test_batches, build_train_batches, to_device
    from trainlab.lenet.config import TrainConfig
    from trainlab.lenet.data_parallel import DataParallelContext
    from trainlab.lenet.evaluate import evaluate
    from trainlab.lenet.plan import resolve
    from trainlab.lenet.setup import build_model, build_optimizer, build_scheduler

    cfg = TrainConfig.from_dict(spec["config"], source="dp compare spec")
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    device = resolve_device(cfg.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    plan = resolve(cfg, device)
    data = load_dataset(cfg.dataset, cfg.data_dir)
    shard = DataParallelContext(mode="ddp", rank=rank, world_size=world, device=device)  # no group: indices only
    batches = build_train_batches(cfg, data, device, shard)

    class LitLeNet(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = build_model(plan)

        def training_step(self, batch, _index):
            x, y = to_device(*batch, self.device, plan.channels_last)
            return F.cross_entropy(self.model(x).float(), y, label_smoothing=plan.label_smoothing)

        def on_train_epoch_start(self):
            batches.set_epoch(self.current_epoch)  # the same order as trainlab's loop, epoch by epoch

        def configure_optimizers(self):
            opt = build_optimizer(plan, self.model)
            sched = build_scheduler(plan, opt, plan.lr, len(batches))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    lit = LitLeNet()
    trainer = L.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_epochs=cfg.epochs,
        use_distributed_sampler=False,  # the batches are already this rank's shard
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
        deterministic=False,
    )
    t0 = time.perf_counter()
    trainer.fit(lit, train_dataloaders=batches)
    fit_seconds = time.perf_counter() - t0
    if rank == 0:
        model = lit.model.to(device)
        result = evaluate(model, build_test_batches(cfg, data, device), device, plan.amp_dtype)
        n_train = len(data.train_labels) if cfg.train_subset is None else min(cfg.train_subset, len(data.train_labels))
        import lightning

        atomic_write_json(
            spec["result"],
            {
                **lightning_row(cfg, world, fit_seconds, n_train, result),
                "note": f"Lightning {lightning.__version__} Trainer, strategy ddp; time = Trainer.fit wall time "
                "(Lightning's set-up included)",
                "torch_threads": torch.get_num_threads(),
            },
            private=True,
        )
    return 0


def lightning_row(cfg, world: int, fit_seconds: float, n_train: int, result: dict) -> dict:
    """A `dp compare` row for the Lightning run, with the columns the other modes have."""
    from trainlab.telemetry.results import DP_COMPARE_COLUMNS

    epoch_seconds = fit_seconds / cfg.epochs
    return {
        **dict.fromkeys(DP_COMPARE_COLUMNS),
        "mode": "lightning",
        "world_size": world,
        "loader": cfg.loader,
        "workers": None,
        "global_batch": cfg.batch_size,
        "epochs": cfg.epochs,
        "seed": cfg.seed,
        "optimizer": cfg.optimizer,
        "device": cfg.device,
        "epoch_seconds": epoch_seconds,
        "images_per_s": n_train / epoch_seconds,
        "test_accuracy": result["test_accuracy"],
        "test_loss": result["test_loss"],
        "status": "ok",
    }


def skipped_row(world: int, why: str) -> dict:
    from trainlab.telemetry.results import DP_COMPARE_COLUMNS

    return {**dict.fromkeys(DP_COMPARE_COLUMNS), "mode": "lightning", "world_size": world, "loader": "device",
            "status": "skipped", "error": why}  # fmt: skip
