"""Batches for training: the device-resident loader (default) and the standard DataLoader path.

`DeviceLoader` puts a whole split on the device once, normalized, and forms each batch with one
`index_select`: no per-sample Python, no host→device copies in the loop. Both paths draw the sample
order from `epoch_permutation(n, seed, epoch)`, a pure function of its arguments, so
- the DataLoader path and the device loader give identical batches (augmentation off), and
- a run resumed at epoch k sees exactly the order an uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from trainlab.data.augment import (
    AUGMENT_STREAM,
    ELASTIC_STREAM,
    SHUFFLE_STREAM,
    Distortion,
    apply_affine,
    elastic_displacement,
    identity_matrices,
    seeded_generator,
)
from trainlab.data.mnist import BACKGROUND, MNIST, normalize
from trainlab.errors import ConfigError


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The sample order of `epoch`: a LongTensor permutation of range(n), a pure function of its arguments."""
    return torch.randperm(n, generator=seeded_generator(seed, epoch, stream=SHUFFLE_STREAM))


def shard_bounds(
    n: int, rank: int, world_size: int, start: int = 0, shares: tuple[float, ...] | None = None
) -> tuple[int, int]:
    """Rows [lo, hi) of `rank` when n rows starting at `start` are split into `world_size` contiguous
    shards whose sizes differ by at most one (the first ranks get the smaller ones); with `shares`
    (one positive number per rank, `--shard-weights`), shard sizes proportional to them instead."""
    if shares is None:
        return start + rank * n // world_size, start + (rank + 1) * n // world_size
    total = sum(shares)
    edge = lambda r: round(n * sum(shares[:r]) / total)  # noqa: E731  (cumulative: the shards tile [0, n))
    return start + edge(rank), start + edge(rank + 1)


def _as_tensor(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else torch.as_tensor(a)


class DeviceLoader:
    """Iterate (x float32 [b, 1, 28, 28], y int64 [b]) batches of a split that lives on `device`.

    `batch_size` is the global batch. With `world_size` > 1, rank r gets rows
    [⌊r·b/W⌋, ⌊(r+1)·b/W⌋) of every global batch, so the global order is the same for any world size
    (like DistributedSampler, but contiguous slices of one shared batch). When W does not divide b
    the shards differ by one row; the trainer weights each rank's gradient by its shard size
    (`shard_weights`), so the step equals single-process training on the global batch. A final
    global batch smaller than `world_size` is dropped, since some ranks would get no rows.
    `augment=True` (or a `Distortion` with `affine=True`) applies a random affine transform on the
    device, one per position in the epoch's order, drawn from a generator seeded by (seed, epoch):
    reproducible, resumable and independent of world size. Host→device traffic happens once per epoch
    (order and transforms), never per step. A `Distortion` with `elastic_alpha` > 0 adds an elastic
    distortion in the same `grid_sample`; its noise is drawn on the device per global batch from a
    generator seeded by (seed, epoch, batch start), so it too is resumable and independent of world size.
    """

    def __init__(
        self,
        images_uint8,
        labels,
        batch_size: int,
        device,
        shuffle: bool = True,
        seed: int = 0,
        augment: bool | Distortion = False,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        shares: tuple[float, ...] | None = None,
        warmup_batch_size: int | None = None,
        warmup_images: int = 0,
    ):
        if batch_size < 1:
            raise ConfigError(f"--batch-size must be a positive integer, got {batch_size}")
        if warmup_batch_size is not None and not world_size <= warmup_batch_size:
            raise ConfigError(
                f"--warmup-batch-size {warmup_batch_size} is smaller than the world size {world_size}: "
                "every rank needs at least one row of each global batch"
            )
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is not valid for world size {world_size}")
        if batch_size < world_size:
            raise ConfigError(
                f"--batch-size {batch_size} is smaller than the world size {world_size}: "
                "every rank needs at least one row of each global batch"
            )
        images, labels = _as_tensor(images_uint8), _as_tensor(labels)
        if images.dtype != torch.uint8 or images.ndim != 3:
            raise ValueError(f"images must be uint8 [N, H, W], got {images.dtype} {list(images.shape)}")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.device = torch.device(device)
        # uint8 goes over the bus (4× less than float32); normalization happens once, on the device.
        self.x = normalize(images.to(self.device)).unsqueeze(1).contiguous()  # [N, 1, H, W] float32
        self.y = labels.to(self.device, dtype=torch.long)
        self.n = len(labels)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.distortion, self.drop_last = Distortion.of(augment), drop_last
        self.rank, self.world_size = rank, world_size
        self.warmup_batch_size, self.warmup_images = warmup_batch_size, warmup_images if warmup_batch_size else 0
        self.epoch = 0
        self.shares: tuple[float, ...] | None = None
        self.set_shares(shares)

    def set_shares(self, shares: tuple[float, ...] | None) -> None:
        """Split every global batch across ranks in proportion to `shares` (None: evenly). Every rank
        must be given the same shares; a rank whose share of a full batch would be empty is refused."""
        if shares is not None:
            shares = tuple(float(w) for w in shares)
            if len(shares) != self.world_size or min(shares) <= 0:
                raise ConfigError(
                    f"shard weights {list(shares)}: expected {self.world_size} positive numbers, one per rank"
                )
            empty = [
                r
                for r in range(self.world_size)
                if len(range(*shard_bounds(self.batch_size, r, self.world_size, 0, shares))) == 0
            ]
            if empty:
                raise ConfigError(
                    f"--shard-weights {','.join(f'{w:g}' for w in shares)}: rank {empty[0]} would get no image of a "
                    f"global batch of {self.batch_size}; raise --batch-size or that rank's weight"
                )
        self.shares = shares

    def bounds(self, n: int, start: int = 0) -> tuple[int, int]:
        """This rank's rows of a global batch of n rows starting at `start`."""
        return shard_bounds(n, self.rank, self.world_size, start, self.shares)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order (and augmentation) the next iteration uses."""
        self.epoch = epoch

    def _global_batch_bounds(self, epoch: int | None = None) -> list[tuple[int, int]]:
        # Batch-size warm-up: the first `warmup_images` of epoch 0 (rounded up to whole batches) go in
        # batches of `warmup_batch_size`, the rest of the run in batches of `batch_size`.
        start, bounds = 0, []
        if (self.epoch if epoch is None else epoch) == 0:
            while start < min(self.warmup_images, self.n):
                bounds.append((start, min(start + self.warmup_batch_size, self.n)))
                start = bounds[-1][1]
        bounds += [(i, min(i + self.batch_size, self.n)) for i in range(start, self.n, self.batch_size)]
        if bounds and (bounds[-1][1] - bounds[-1][0] < (self.batch_size if self.drop_last else self.world_size)):
            bounds.pop()
        elif (
            bounds
            and self.shares is not None
            and any(
                len(range(*shard_bounds(bounds[-1][1] - bounds[-1][0], r, self.world_size, 0, self.shares))) == 0
                for r in range(self.world_size)
            )
        ):
            bounds.pop()  # a weighted split of the short last batch would leave a rank without rows
        return bounds

    def __len__(self) -> int:
        """Steps in the current epoch (set_epoch): epoch 0 has more of them under a batch-size warm-up."""
        return len(self._global_batch_bounds())

    def total_steps(self, epochs: int) -> int:
        """Steps in epochs 0 … epochs−1."""
        return len(self._global_batch_bounds(0)) + (epochs - 1) * len(self._global_batch_bounds(1)) if epochs else 0

    def shard_weights(self) -> list[float]:
        """Per step: W·(this rank's rows)/(global rows). Scaling the rank's mean loss by it makes the
        average over ranks of the gradients (what DDP and the all-reduces compute) the gradient of the
        global batch's mean loss, even when the shards are uneven; 1.0 exactly for even shards."""
        weights = []
        for start, stop in self._global_batch_bounds():
            lo, hi = self.bounds(stop - start)
            weights.append(self.world_size * (hi - lo) / (stop - start))
        return weights

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = epoch_permutation(self.n, self.seed, self.epoch) if self.shuffle else torch.arange(self.n)
        bounds = self._global_batch_bounds()
        # Everything random for the epoch crosses to the device once, here: a host→device copy inside
        # the loop would make every step wait for the GPU to drain its queue.
        order = order.to(self.device)
        theta = selected = None
        if self.distortion.enabled and bounds:
            # One transform per position in the epoch's global order, so every world size (and a
            # resumed run) applies the same transform to the same sample.
            generator = seeded_generator(self.seed, self.epoch, stream=AUGMENT_STREAM)
            n = bounds[-1][1]
            theta = self.distortion.matrices(n, generator) if self.distortion.affine else identity_matrices(n)
            selected = self.distortion.selected(n, generator)
            if selected is not None:  # images left out of this epoch's distortion keep the identity
                theta = torch.where(selected.view(-1, 1, 1), theta, identity_matrices(n))
                selected = selected.to(self.device)
            theta = theta.to(self.device)
        for start, stop in bounds:
            # This rank's slice of the global batch (the whole batch when world_size == 1).
            lo, hi = self.bounds(stop - start, start)
            index = order[lo:hi]
            x, y = self.x.index_select(0, index), self.y.index_select(0, index)
            if theta is not None:
                displacement = None
                if self.distortion.elastic_alpha > 0:
                    displacement = self._elastic(start, stop - start)[lo - start : hi - start]
                    if selected is not None:
                        displacement = displacement * selected[lo:hi].view(-1, 1, 1, 1)
                x = apply_affine(x, theta[lo:hi], fill=BACKGROUND, displacement=displacement)
            yield x, y

    def _elastic(self, start: int, size: int) -> torch.Tensor:
        """The displacement fields of the global batch starting at `start` (every rank draws all of them
        and keeps its rows: the fields of a sample do not depend on the world size)."""
        generator = seeded_generator(self.seed, self.epoch, start, stream=ELASTIC_STREAM, device=self.device)
        _, _, height, width = self.x.shape
        d = self.distortion
        return elastic_displacement(size, height, width, d.elastic_alpha, d.elastic_sigma, generator, self.device)


class EpochSampler(torch.utils.data.Sampler[int]):
    """Yields `epoch_permutation(n, seed, epoch)` (or range(n)), the same order as `DeviceLoader`."""

    def __init__(self, n: int, shuffle: bool = True, seed: int = 0):
        self.n, self.shuffle, self.seed, self.epoch = n, shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        order = epoch_permutation(self.n, self.seed, self.epoch) if self.shuffle else torch.arange(self.n)
        return iter(order.tolist())


class EpochDataLoader(torch.utils.data.DataLoader):
    """A DataLoader whose `set_epoch` reaches its sampler and its dataset (for per-epoch augmentation)."""

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        dataset = self.dataset
        while not hasattr(dataset, "set_epoch") and hasattr(dataset, "dataset"):
            dataset = dataset.dataset  # look through torch.utils.data.Subset and similar wrappers
        if hasattr(dataset, "set_epoch"):
            # Workers are re-created each epoch (no persistent_workers), so they get this value.
            dataset.set_epoch(epoch)


def make_dataloader(
    dataset: MNIST,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    workers: int = 0,
    pin_memory: bool = False,
    drop_last: bool = False,
) -> EpochDataLoader:
    """The standard per-sample path: `dataset` through a DataLoader with `workers` processes.

    Sample order comes from `EpochSampler`, so with augmentation off the batches equal
    `DeviceLoader`'s for the same seed and epoch. Call `.set_epoch(epoch)` before each epoch.
    """
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be a positive integer, got {batch_size}")
    if workers < 0:
        raise ConfigError(f"--workers must be >= 0, got {workers}")
    return EpochDataLoader(
        dataset,
        batch_size=batch_size,
        sampler=EpochSampler(len(dataset), shuffle, seed),
        num_workers=workers,
        pin_memory=pin_memory,
        drop_last=drop_last,
    )
