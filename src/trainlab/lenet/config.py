"""`TrainConfig`: every setting of a LeNet-5 run, one field each, with its flag's help text; presets.

The flags of `trainlab train` are derived from these fields (`trainlab.flags`), and `config.json` in a
run directory is this dataclass as JSON.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from trainlab.errors import ConfigError
from trainlab.flags import Config, opt


@dataclass
class TrainConfig(Config):
    """LeNet-5 on MNIST. The defaults (5 epochs, batch 256, OneCycle AdamW at 5e-3) reach ≥99.0% test
    accuracy; they were chosen for time-to-99%, measured in benchmarks/lenet_time_to_99.py."""

    # what to train
    act: str = opt("relu", "activation: relu, gelu, gelu-python, gelu-cpp, gelu-triton, gelu-cuda, …")
    pool: str = opt("max", "LeNet pooling: max | avg")
    batchnorm: bool = opt(False, "BatchNorm after convs and hidden FCs (the `best` preset)")
    batchnorm_conv1: bool = opt(True, "with --batchnorm, also after conv1 (off: conv2 and the hidden FCs only; "
                                      "cheaper on a CPU, the `fast` preset)")
    # data
    data_dir: str | None = opt(None, "directory with the official MNIST IDX files (default: embedded MNIST)")
    loader: str = opt("device", "device (whole set resident on the device) | dataloader (torch DataLoader)")
    workers: int = opt(0, "DataLoader worker processes (--loader dataloader)")
    augment: bool = opt(False, "random affine augmentation on the device (ranges: --augment-degrees/-translate/-scale)")
    augment_degrees: float = opt(15.0, "affine augmentation: rotation range ± degrees")
    augment_translate: float = opt(0.1, "affine augmentation: shift range ± this fraction of the width/height")
    augment_scale: float = opt(0.2, "affine augmentation: zoom range 1 ± this fraction")
    augment_p: float = opt(1.0, "probability that a training image is distorted (affine/elastic); the rest stay as is")
    elastic_alpha: float = opt(0.0, "elastic distortion (Simard et al. 2003) strength α in pixels, on the device "
                                    "with the affine; 0 = off, the paper uses 34")
    elastic_sigma: float = opt(4.0, "elastic distortion smoothness: Gaussian σ of the displacement field in pixels")
    train_subset: int | None = opt(None, "train on the first N images (tests, quick looks)")
    test_subset: int | None = opt(None, "evaluate on the first N test images")
    # optimization
    epochs: int = opt(5, "passes over the training set")
    batch_size: int = opt(256, "global batch size (split across ranks when data-parallel)")
    optimizer: str = opt("adamw", "adamw | adam | sgd")
    lr: float = opt(5e-3, "peak learning rate (OneCycle max / constant value)")
    weight_decay: float = opt(1e-4, "weight decay (decoupled for AdamW, L2 for SGD/Adam)")
    momentum: float = opt(0.9, "SGD momentum (Nesterov)", cli=False)
    schedule: str = opt("onecycle", "onecycle | cosine | constant")
    warmup_epochs: float = opt(0.0, "linear warm-up for cosine/constant (OneCycle has its own)")
    label_smoothing: float = opt(0.0, "cross-entropy label smoothing")
    ema: float = opt(0.0, "keep an exponential moving average of the weights with this decay (e.g. 0.999) and "
                          "evaluate/checkpoint it; 0 = off")
    scale_lr: str = opt("none", "linear | sqrt | none: multiply lr by (global batch / 128) or its sqrt")
    # execution
    device: str = opt("auto", "auto (CUDA if available) | cpu | cuda | cuda:N")
    amp: str = opt("auto", "auto (bf16 autocast on CUDA) | bf16 | off")
    channels_last: str = opt("auto", "auto (on CUDA) | on | off")
    compile: bool = opt(False, "torch.compile the model (compile time reported separately)")
    parallel: str = opt("none", "none | dp | ddp | allreduce (see `trainlab dp`)")
    seed: int = opt(0, "seeds init, shuffling and augmentation; same seed → same curve on CPU")
    tta: bool = opt(False, "also report test accuracy under test-time augmentation (mean softmax over fixed "
                           "shifted views), separately from test_accuracy")
    eval_batch_size: int = opt(2000, "test-set batch size (no gradients, so large is fine)")
    step_timing: bool = opt(False, "split each step into data / compute / communication time (syncs every step)")
    dist_timeout: float | None = opt(None, "process-group timeout in seconds: a dead or hung rank fails the "
                                           "others after this long (default 120)", metavar="S")
    # bookkeeping
    out: str | None = opt(None, "run directory (default runs/<name>)")
    name: str | None = opt(None, "run name (default <act>-<timestamp>)")
    progress: bool = opt(True, "progress bar within each epoch")
    tensorboard: bool = opt(True, "write TensorBoard events")
    gpu_telemetry: bool = opt(True, "sample GPU utilization/memory/power with NVML")
    stop_after: int | None = opt(None, "stop after N epochs as if interrupted (to try --resume)")
    preset: str = opt("default", "default | fast (time-to-99% on a CPU: BatchNorm, bf16, 2 epochs) | best (≥99.6%: "
                                 "BatchNorm, augmentation, EMA, long schedule)", choices=("default", "fast", "best"))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


# Presets set several fields at once; explicit flags given by the user still win (see lenet.cli).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    # Time-to-99% on a CPU (benchmarks/lenet_time_to_99.py, measured against the seed-style loop):
    # BatchNorm + label smoothing 0.1 + a 2× higher peak lr reach 99% in 2 epochs (99.07–99.33% on seeds 0–4);
    # bf16 autocast runs the convolutions on the CPU's bf16 units (AMX/AVX512-BF16; oneDNN) and channels-last
    # speeds them up further. conv1's BatchNorm is left out: on 6×28×28 channels-last activations it costs
    # more than all the convolutions it would help (benchmarks/lenet_cpu_profile.py).
    "fast": dict(batchnorm=True, batchnorm_conv1=False, epochs=2, lr=1e-2, label_smoothing=0.1, amp="bf16",
                 channels_last="on"),
    # ≥99.6% (benchmarks/lenet_accuracy.py, 5 seeds): BatchNorm + a moderate affine (±10°, ±10% shift,
    # ±10% zoom) on 3 of 4 images (the untouched quarter keeps the crisp test digits in distribution) +
    # label smoothing + a 60-epoch OneCycle + an EMA of the weights (evaluated and checkpointed).
    # Elastic distortion (--elastic-alpha) was measured and is not used: it lowered LeNet-5's accuracy.
    "best": dict(batchnorm=True, augment=True, augment_degrees=10.0, augment_translate=0.1, augment_scale=0.1,
                 augment_p=0.75, epochs=60, lr=5e-3, label_smoothing=0.05, weight_decay=5e-4, ema=0.999),
}


def apply_preset(cfg: TrainConfig, preset: str, explicit: set[str] | None = None) -> TrainConfig:
    explicit = explicit or set()
    if preset not in PRESETS:
        raise ConfigError(f"--preset {preset!r}: expected one of {', '.join(PRESETS)}")
    values = {k: v for k, v in PRESETS[preset].items() if k not in explicit}
    return dataclasses.replace(cfg, preset=preset, **values)
