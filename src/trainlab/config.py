"""Typed configuration: one dataclass per command, one comment per field, JSON in and out."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from trainlab.errors import ConfigError


@dataclass
class TrainConfig:
    """LeNet-5 on MNIST. The defaults (5 epochs, batch 256, OneCycle AdamW at 5e-3) reach ≥99.0% test
    accuracy; they were chosen for time-to-99%, measured in benchmarks/lenet_time_to_99.py."""

    # what to train
    act: str = "relu"                  # activation name (models.activations): relu, gelu, gelu-cpp, …
    pool: str = "max"                  # LeNet pooling: max | avg
    batchnorm: bool = False            # BatchNorm after convs and hidden FCs (the `best` preset)
    # data
    data_dir: str | None = None        # official IDX files / torchvision MNIST/raw; None → embedded MNIST
    loader: str = "device"             # device: whole set resident on the device | dataloader: torch DataLoader
    workers: int = 0                   # DataLoader worker processes (loader=dataloader)
    augment: bool = False              # random affine (±15°, ±10% shift, 0.8–1.2 scale) on the device
    train_subset: int | None = None    # train on the first N images (tests, quick looks)
    test_subset: int | None = None     # evaluate on the first N test images
    # optimization
    epochs: int = 5                    # passes over the training set
    batch_size: int = 256              # global batch (split across ranks when data-parallel)
    optimizer: str = "adamw"           # adamw | adam | sgd
    lr: float = 5e-3                   # peak learning rate (OneCycle max / constant value)
    weight_decay: float = 1e-4         # decoupled for AdamW, L2 for SGD/Adam
    momentum: float = 0.9              # SGD momentum (Nesterov)
    schedule: str = "onecycle"         # onecycle | cosine | constant
    warmup_epochs: float = 0.0         # linear warm-up for cosine/constant (OneCycle has its own)
    label_smoothing: float = 0.0       # cross-entropy label smoothing
    scale_lr: str = "none"             # linear | sqrt | none: multiply lr by (global batch / 128) or its sqrt
    # execution
    device: str = "auto"               # auto (CUDA if available) | cpu | cuda | cuda:N
    amp: str = "auto"                  # auto (bf16 autocast on CUDA) | bf16 | off
    channels_last: str = "auto"        # auto (on CUDA) | on | off
    compile: bool = False              # torch.compile the model (compile time reported separately)
    parallel: str = "none"             # none | dp | ddp | allreduce (see `trainlab dp`)
    seed: int = 0                      # seeds init, shuffling and augmentation; same seed → same curve on CPU
    eval_batch_size: int = 2000        # test-set batch size (no gradients, so large is fine)
    # bookkeeping
    out: str | None = None             # run directory; default runs/<name>
    name: str | None = None            # run name; default <act>-<timestamp>
    progress: bool = True              # progress bar within an epoch
    tensorboard: bool = True           # write TensorBoard events
    gpu_telemetry: bool = True         # NVML sampler (utilization, memory, power, temperature)
    stop_after: int | None = None      # stop after this many epochs as if killed (to exercise --resume)
    preset: str = "default"            # default | best (recorded; applied by `apply_preset`)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# Presets set several fields at once; explicit flags given by the user still win (see train.cli).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    # ≥99.5%: BatchNorm + augmentation + longer OneCycle + label smoothing.
    "best": dict(batchnorm=True, augment=True, epochs=30, lr=5e-3, label_smoothing=0.05, weight_decay=5e-4),
}


def apply_preset(cfg: TrainConfig, preset: str, explicit: set[str] | None = None) -> TrainConfig:
    explicit = explicit or set()
    if preset not in PRESETS:
        raise ConfigError(f"--preset {preset!r}: expected one of {', '.join(PRESETS)}")
    values = {k: v for k, v in PRESETS[preset].items() if k not in explicit}
    return dataclasses.replace(cfg, preset=preset, **values)
