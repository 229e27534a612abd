"""The parts a training run is assembled from its plan (`lenet.plan`): model, optimizer, schedule.

Every choice here was checked by `TrainConfig.validate()` (each field's `check=`), the one owner of
those checks, so a value that reaches these functions is one of the listed choices."""

from __future__ import annotations

import math
import re
from contextlib import nullcontext

import torch

from trainlab.errors import HardwareError, UserError
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.manual_optim import build_manual
from trainlab.lenet.models import make_model
from trainlab.lenet.muon import MuonAdamW, muon_groups
from trainlab.lenet.plan import LeNetPlan
from trainlab.lenet.plan import scaled_lr as _scaled_lr


def build_model(plan: LeNetPlan) -> torch.nn.Module:
    """The plan's model on its device, seeded, in its memory format; probed with one tiny forward pass so
    that an implementation this device cannot run (`--act gelu-cuda` on a CPU, `--ops own=triton`
    without Triton) fails here, naming the flag, before a run directory is created or data is loaded."""
    device = plan.torch_device
    flag = f"--ops {plan.ops_spec}" if plan.ops != "aten" else f"--act {plan.act}"
    try:
        torch.manual_seed(plan.seed)  # the initial weights depend on the seed alone
        model = make_model(
            plan.model,
            act=plan.act,
            pool=plan.pool,
            batchnorm=plan.batchnorm,
            ops=plan.ops_spec,
            batchnorm_conv1=plan.batchnorm_conv1,
        ).to(device)
        if plan.channels_last:
            model = model.to(memory_format=torch.channels_last)
        was_training = model.training
        with torch.no_grad():  # eval: the probe must not move BatchNorm's running statistics
            model.eval()(torch.zeros(2, 1, 28, 28, device=device))
        model.train(was_training)
    except UserError as e:
        # the operator's message names its Python argument (impl='cuda'); keep its reason, name the flag
        reason = re.sub(r"^.*?impl='?\w+'?: ", "", str(e)).split("; ")[0]
        raise HardwareError(
            f"{flag}: cannot run on {device}: {reason}; choose another {flag.split()[0]} "
            f"(`trainlab train --help` lists them)"
        ) from None
    return model


def scaled_lr(cfg: TrainConfig) -> float:
    """The learning rate scaled with the global batch relative to the reference batch of 128 (--scale-lr)."""
    return _scaled_lr(cfg.lr, cfg.batch_size, cfg.scale_lr)


def build_optimizer(plan: LeNetPlan, model: torch.nn.Module, lr: float | None = None) -> torch.optim.Optimizer:
    """The plan's optimizer at `lr` (default: the plan's peak lr). With a captured step (`plan.capturable`)
    its state and its learning rate live on the device: the scheduler writes the lr tensor in place, and
    the graph reads it at every replay."""
    params = list(model.parameters())
    lr = plan.lr if lr is None else lr
    # The fused kernels update every parameter in one pass instead of ~13 tensor ops per parameter:
    # on CUDA one launch instead of one per op (for a 10-tensor LeNet the launches are the cost); on
    # a CPU, where torch's default is the per-tensor loop, 6 % of the `fast` step
    # (benchmarks/lenet_cpu_step.py, `+fused`).
    fused = {"fused": True} if plan.fused_optimizer and params[0].device.type in ("cuda", "cpu") else {}
    if plan.capturable:
        lr = torch.tensor(lr, dtype=torch.float32, device=params[0].device)
        fused["capturable"] = True
    if plan.optimizer == "muon":  # Muon for the hidden weight matrices, AdamW for the rest (lenet.muon)
        return MuonAdamW(muon_groups(model), lr=lr, weight_decay=plan.weight_decay)
    if plan.optimizer.startswith("manual-"):  # written out over the parameter list (lenet.manual_optim)
        return build_manual(plan.optimizer, params, lr, plan.weight_decay, plan.momentum)
    if plan.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=plan.weight_decay, **fused)
    if plan.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=plan.weight_decay, **fused)
    return torch.optim.SGD(
        params, lr=lr, momentum=plan.momentum, nesterov=True, weight_decay=plan.weight_decay, **fused
    )


def build_scheduler(plan: LeNetPlan, optimizer, lr: float, steps_per_epoch: int, total_steps: int | None = None):
    """The per-step LR schedule; `total_steps` when the epochs differ in length (batch-size warm-up), and
    then `steps_per_epoch` is the first epoch's (the one --warmup-epochs counts in)."""
    total = max(1, total_steps if total_steps is not None else plan.epochs * steps_per_epoch)
    if plan.schedule == "onecycle" and total >= 4:
        # OneCycle warms up for 25% of training then anneals: the fastest route to 99% for small nets.
        # torch's OneCycleLR divides by zero when the warm-up is shorter than 2 steps (tiny runs).
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=lr, total_steps=total, pct_start=max(0.25, 2.0 / total)
        )
    if plan.schedule == "onecycle":  # fewer than 4 steps in all: nothing to schedule
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    warmup = int(plan.warmup_epochs * steps_per_epoch)
    if plan.schedule == "cosine":

        def f(s):
            return (
                (s + 1) / warmup
                if s < warmup
                else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, total - warmup)))
            )
    elif plan.schedule == "linear":
        # Up to the peak, then straight down to 0 at the last step: for a one-epoch run every step
        # counts, and the last ones, at a tiny lr, settle the weights (and BatchNorm statistics).
        f = lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup))  # noqa: E731
    else:  # constant
        f = lambda s: (s + 1) / warmup if s < warmup else 1.0  # noqa: E731
    return torch.optim.lr_scheduler.LambdaLR(optimizer, f)


def autocast(device: torch.device, dtype: torch.dtype | None, cache: bool = True):
    """Autocast to `dtype` (bf16, or fp16 below sm80) when it is set; `cache=False` inside a CUDA-graph capture (PyTorch requires it)."""
    return (
        torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=cache)
        if dtype is not None
        else nullcontext()
    )
