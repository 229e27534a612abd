"""The parts a training run is assembled from: model, optimizer, schedule, precision.

Every choice here was checked by `TrainConfig.validate()` (each field's `check=`), the one owner of
those checks, so a value that reaches these functions is one of the listed choices."""

from __future__ import annotations

import math
import re
from contextlib import nullcontext

import torch

from trainlab.device import AMP_DTYPES, amp_for_sm, cuda_sm
from trainlab.errors import HardwareError, UserError
from trainlab.ops.build import check_toolchain
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.model import resolve_ops
from trainlab.lenet.models import make_model


def build_model(cfg: TrainConfig, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)  # the initial weights depend on the seed alone
    model = make_model(cfg.model, act=cfg.act, pool=cfg.pool, batchnorm=cfg.batchnorm, ops=model_ops(cfg, device),
                       batchnorm_conv1=cfg.batchnorm_conv1).to(device)
    if use_channels_last(cfg, device):
        model = model.to(memory_format=torch.channels_last)
    return model


def model_ops(cfg: TrainConfig, device: torch.device) -> str:
    """--ops with `auto` resolved for this device: fused on a CPU where it applies and a C++ toolchain
    can build it (else PyTorch's layers: `auto` is a speed choice, never a reason to fail), aten
    elsewhere. The resolved value is recorded in summary.json (`ops`)."""
    if cfg.model not in ("lenet5", "lenet5-bn"):
        return "aten" if cfg.ops == "auto" else cfg.ops
    ops = resolve_ops(cfg.ops, device, cfg.act, cfg.pool, cfg.batchnorm or cfg.model == "lenet5-bn", cfg.batchnorm_conv1)
    if cfg.ops == "auto" and ops == "fused":
        try:
            check_toolchain(with_cuda=False)
        except HardwareError:
            return "aten"
    return ops


def check_model_runs(cfg: TrainConfig, device: torch.device) -> None:
    """Build the model on `device` and run one tiny forward pass: an implementation this device cannot run
    (`--act gelu-cuda` on a CPU, `--ops own=triton` without Triton) fails here, naming the flag, before
    a run directory is created or data is loaded, instead of after the first batch."""
    ops = model_ops(cfg, device)
    flag = f"--ops {cfg.ops}" if ops != "aten" else f"--act {cfg.act}"
    try:
        model = build_model(cfg, device)
        with torch.no_grad():
            model.eval()(torch.zeros(2, 1, 28, 28, device=device))
    except UserError as e:
        # the operator's message names its Python argument (impl='cuda'); keep its reason, name the flag
        reason = re.sub(r"^.*?impl='?\w+'?: ", "", str(e)).split("; ")[0]
        raise HardwareError(f"{flag}: cannot run on {device}: {reason}; choose another {flag.split()[0]} "
                            f"(`trainlab train --help` lists them)") from None


def scaled_lr(cfg: TrainConfig, world_size: int = 1) -> float:
    """Scale the learning rate with the global batch relative to the reference batch of 128."""
    ratio = cfg.batch_size / 128
    if cfg.scale_lr == "linear":
        return cfg.lr * ratio
    if cfg.scale_lr == "sqrt":
        return cfg.lr * math.sqrt(ratio)
    return cfg.lr  # none


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    params = list(model.parameters())
    # The fused kernels update every parameter in one pass instead of ~13 tensor ops per parameter:
    # on CUDA one launch instead of one per op (for a 10-tensor LeNet the launches are the cost); on
    # a CPU, where torch's default is the per-tensor loop, 6 % of the `fast` step
    # (benchmarks/lenet_cpu_step.py, `+fused`).
    fused = {"fused": True} if params[0].device.type in ("cuda", "cpu") else {}
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay, **fused)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay, **fused)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, nesterov=True, weight_decay=cfg.weight_decay, **fused)


def build_scheduler(cfg: TrainConfig, optimizer, lr: float, steps_per_epoch: int, total_steps: int | None = None):
    """The per-step LR schedule; `total_steps` when the epochs differ in length (batch-size warm-up), and
    then `steps_per_epoch` is the first epoch's (the one --warmup-epochs counts in)."""
    total = max(1, total_steps if total_steps is not None else cfg.epochs * steps_per_epoch)
    if cfg.schedule == "onecycle" and total >= 4:
        # OneCycle warms up for 25% of training then anneals: the fastest route to 99% for small nets.
        # torch's OneCycleLR divides by zero when the warm-up is shorter than 2 steps (tiny runs).
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total, pct_start=max(0.25, 2.0 / total))
    if cfg.schedule == "onecycle":  # fewer than 4 steps in all: nothing to schedule
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    warmup = int(cfg.warmup_epochs * steps_per_epoch)
    if cfg.schedule == "cosine":
        f = lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, total - warmup)))  # noqa: E731
    elif cfg.schedule == "linear":
        # Up to the peak, then straight down to 0 at the last step: for a one-epoch run every step
        # counts, and the last ones, at a tiny lr, settle the weights (and BatchNorm statistics).
        f = lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup))  # noqa: E731
    else:  # constant
        f = lambda s: (s + 1) / warmup if s < warmup else 1.0  # noqa: E731
    return torch.optim.lr_scheduler.LambdaLR(optimizer, f)


def amp_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """`auto`: bf16 on an sm80+ GPU, fp16 (with the loop's GradScaler) below it, off on the CPU. `bf16`
    (also the `fast` preset's) on a GPU below sm80, which has none, is fp16 too: the summary's "amp"
    records the type that ran."""
    if cfg.amp == "off":
        return None
    if device.type == "cuda" and cfg.amp in ("auto", "bf16"):
        return AMP_DTYPES[amp_for_sm(cuda_sm(device))]
    if cfg.amp == "auto":
        return None
    return AMP_DTYPES[cfg.amp]


def autocast(device: torch.device, dtype: torch.dtype | None):
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None else nullcontext()


def use_channels_last(cfg: TrainConfig, device: torch.device) -> bool:
    if cfg.channels_last == "auto":   # our operators (--ops own) compute in NCHW
        return device.type == "cuda" and model_ops(cfg, device) in ("aten", "fused")
    return cfg.channels_last == "on"
