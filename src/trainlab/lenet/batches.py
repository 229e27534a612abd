"""The batches a LeNet-5 run trains and tests on, built from the MNIST arrays and the config.

Training batches come from the device-resident loader (default) or a per-sample DataLoader; with data
parallelism each rank gets its shard of every global batch. Test batches always come from the device
loader, in order; with data parallelism each rank tests its contiguous shard of the test set and
`evaluate` gathers the results (multi-device prediction).
"""

from __future__ import annotations

import torch

from trainlab.data.loader import DeviceLoader, make_dataloader, shard_bounds
from trainlab.data.mnist import MNIST
from trainlab.errors import ConfigError
from trainlab.lenet.config import LOADERS, TrainConfig
from trainlab.lenet.data_parallel import DataParallelContext


def _subset(images, labels, n: int | None):
    return (images, labels) if n is None else (images[:n], labels[:n])


def build_train_batches(cfg: TrainConfig, data, device: torch.device, par: DataParallelContext | None = None):
    """Training batches; with data parallelism each rank gets its shard of every global batch."""
    par = par or DataParallelContext(device=device)
    images, labels = _subset(data.train_images, data.train_labels, cfg.train_subset)
    if cfg.loader == "device":
        return DeviceLoader(
            images,
            labels,
            cfg.batch_size,
            device,
            shuffle=True,
            seed=cfg.seed,
            augment=cfg.distortion(),
            rank=par.rank,
            world_size=par.world_size,
            warmup_batch_size=cfg.warmup_batch_size,
            warmup_images=int(cfg.batch_warmup_epochs * len(labels)),
        )
    if cfg.loader == "dataloader":
        if par.world_size > 1:
            raise ConfigError(
                f"--loader dataloader is single-process; with --parallel {par.mode} over {par.world_size} "
                "ranks use --loader device (it shards every global batch across ranks)"
            )
        ds = MNIST(train=True, arrays=data, augment=cfg.distortion(), seed=cfg.seed)
        if cfg.train_subset is not None:
            ds = torch.utils.data.Subset(ds, range(cfg.train_subset))
        return make_dataloader(
            ds, cfg.batch_size, shuffle=True, seed=cfg.seed, workers=cfg.workers, pin_memory=device.type == "cuda"
        )
    raise ConfigError(f"--loader {cfg.loader!r}: expected one of {', '.join(LOADERS)}")


def build_test_batches(cfg: TrainConfig, data, device: torch.device, par: DataParallelContext | None = None):
    """The test set in order; this rank's contiguous shard of it when several ranks share the evaluation."""
    images, labels = _subset(data.test_images, data.test_labels, cfg.test_subset)
    if par is not None and par.multi_process:
        lo, hi = shard_bounds(len(labels), par.rank, par.world_size)
        images, labels = images[lo:hi], labels[lo:hi]
    return DeviceLoader(images, labels, cfg.eval_batch_size, device, shuffle=False, augment=False)


def to_device(x, y, device, channels_last: bool):
    """A batch on the training device (a no-op for device-resident batches), in the model's memory format."""
    x = x.to(device, non_blocking=True)
    y = y.to(device, non_blocking=True)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y
