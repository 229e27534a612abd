"""`resolve(config, device) → LeNetPlan`: a LeNet-5 run's recipe, resolved once on the machine it runs on.

`TrainConfig` is what the user asked for, `auto`s included; the plan is what will run: the layers
(`--ops auto` → fused or aten), the precision, the memory format, the step mode (`--step-mode auto` →
cudagraph, compile or eager) and the optimizer as built, with no `auto` left and nothing left to parse.
Every machine-dependent check lives here, so a setting that cannot run fails before a run directory or
any data exists; the model, the optimizer, the step (`lenet.step`), the loop, `trainlab profile` and
the benchmarks read the plan instead of re-deriving a setting. summary.json records it (`plan`).

This module sits below `lenet.config` (which imports its STEP_MODES): `resolve` takes the config by
its fields and imports nothing from the command layer, so the import graph stays acyclic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from trainlab.device import AMP_DTYPES, cuda_sm
from trainlab.errors import ConfigError, HardwareError
from trainlab.hardware import amp_for_sm, cpu_has_bf16, matmul_precision
from trainlab.lenet.model import parse_ops, resolve_ops
from trainlab.ops.build import check_toolchain

STEP_MODES = ("eager", "compile", "cudagraph")
LENET_MODELS = ("lenet5", "lenet5-bn")
# Activations made of PyTorch's own kernels: safe to capture in a CUDA graph. Ours (gelu-cpp, -triton,
# -cuda) launch through extensions whose capture-safety nobody has checked, so `auto` does not graph them.
CAPTURE_SAFE_ACTS = ("relu", "tanh", "sigmoid", "silu", "gelu", "gelu-tanh")


@dataclass(frozen=True)
class LeNetPlan:
    """What a LeNet-5 run computes and how, every choice made (summary.json's `plan`)."""

    device: str  # "cpu", "cuda:0", …
    # the model
    model: str
    act: str
    pool: str
    batchnorm: bool  # lenet5-bn resolved to batchnorm=True
    batchnorm_conv1: bool
    ops: str  # aten | fused | own (whose layers, --ops auto resolved)
    ops_impl: str | None  # with own: python | cpp | triton | cuda
    # execution
    precision: str  # bf16 | fp16 (autocast; fp16 with a GradScaler in the step) | fp32
    channels_last: bool
    tf32: bool  # TF32 allowed: matmul_precision below highest
    matmul_precision: str  # highest | high | medium (torch.set_float32_matmul_precision; --tf32 on = high)
    step_mode: str  # eager | compile | cudagraph (lenet.step)
    compile_mode: str  # torch.compile's mode in the compile step: "default" (benchmarks may ask for others)
    # the optimization
    batch_size: int  # global
    epochs: int
    optimizer: str  # adamw | adam | sgd | manual-sgd | manual-adamw | muon
    lr: float  # the peak lr after --scale-lr
    weight_decay: float
    momentum: float
    fused_optimizer: bool  # torch's fused kernel: one pass over all parameters
    capturable: bool  # optimizer state and lr on the device: the optimizer step inside the CUDA graph
    schedule: str
    warmup_epochs: float
    label_smoothing: float
    seed: int

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return AMP_DTYPES.get(self.precision)

    @property
    def grad_scaler(self) -> bool:
        """fp16's narrow range loses small gradients unless the loss is scaled (lenet.step)."""
        return self.precision == "fp16"

    @property
    def optimizer_in_graph(self) -> bool:
        """cudagraph captures the optimizer step too, except under OneCycle: OneCycleLR cycles Adam's
        beta1 as a Python float, which torch's fused kernel takes as an argument and a graph would freeze
        at its capture-time value. There the graph holds forward + backward and the same fused AdamW
        kernel runs after each replay, one launch reading this step's beta1 (lenet.step)."""
        return self.step_mode == "cudagraph" and self.capturable

    @property
    def ops_spec(self) -> str:
        """The layers as `make_model` takes them (own at a rung is `own=IMPL`)."""
        return f"own={self.ops_impl}" if self.ops == "own" else self.ops

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def resolve(cfg, device: torch.device) -> LeNetPlan:
    """The plan for `cfg` (a validated TrainConfig) on `device`; raises ConfigError/HardwareError naming the flag."""
    device = torch.device(device)
    batchnorm = cfg.batchnorm or cfg.model == "lenet5-bn"
    ops = _ops(cfg, device, batchnorm)
    impl = parse_ops(ops)
    precision = _precision(cfg.amp, device)
    # our operators (--ops own) compute in NCHW, so `auto` keeps them there
    channels_last = cfg.channels_last == "on" or (
        cfg.channels_last == "auto" and device.type == "cuda" and ops in ("aten", "fused")
    )
    step_mode = _step_mode(cfg, device, ops, precision)
    lr = scaled_lr(cfg.lr, cfg.batch_size, cfg.scale_lr)
    precision_ = matmul_precision(cfg.tf32, cfg.matmul_precision)
    return LeNetPlan(
        device=str(device),
        model=cfg.model,
        act=cfg.act,
        pool=cfg.pool,
        batchnorm=batchnorm,
        batchnorm_conv1=cfg.batchnorm_conv1,
        ops="own" if impl is not None else ops,
        ops_impl=impl,
        precision=precision,
        channels_last=channels_last,
        tf32=precision_ != "highest",
        matmul_precision=precision_,
        step_mode=step_mode,
        compile_mode="default",
        batch_size=cfg.batch_size,
        epochs=cfg.epochs,
        optimizer=cfg.optimizer,
        lr=lr,
        weight_decay=cfg.weight_decay,
        momentum=cfg.momentum,
        # muon: its AdamW half (lenet.muon)
        fused_optimizer=device.type in ("cuda", "cpu") and cfg.optimizer in ("adamw", "adam", "sgd", "muon"),
        capturable=step_mode == "cudagraph" and cfg.schedule != "onecycle",
        schedule=cfg.schedule,
        warmup_epochs=cfg.warmup_epochs,
        label_smoothing=cfg.label_smoothing,
        seed=cfg.seed,
    )


def scaled_lr(lr: float, batch_size: int, rule: str) -> float:
    """--scale-lr: multiply the lr by (global batch / 128), or its square root."""
    ratio = batch_size / 128
    return lr * ratio if rule == "linear" else lr * ratio**0.5 if rule == "sqrt" else lr


def _ops(cfg, device: torch.device, batchnorm: bool) -> str:
    """--ops with `auto` resolved for this device: fused on a CPU where it applies and a C++ toolchain
    can build it (else PyTorch's layers: `auto` is a speed choice, never a reason to fail), aten elsewhere."""
    if cfg.model not in LENET_MODELS:
        return "aten" if cfg.ops == "auto" else cfg.ops
    ops = resolve_ops(cfg.ops, device, cfg.act, cfg.pool, batchnorm, cfg.batchnorm_conv1)
    if cfg.ops == "auto" and ops == "fused":
        try:
            check_toolchain(with_cuda=False)
        except HardwareError:
            return "aten"
    return ops


def _precision(amp: str, device: torch.device) -> str:
    """--amp resolved: `auto` on a GPU is its 16-bit type (`hardware.amp_for_sm`: bf16 from sm80 on, fp16
    below, e.g. the RTX 2080 Ti's sm75), off on the CPU. `bf16` (also the `fast` preset's) is the device's
    own 16-bit type where it has no bf16: fp16 on a GPU below sm80, fp32 on a CPU without bf16 units
    (emulated bf16 there is slower than fp32 and no more exact). summary.json's plan records what ran."""
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return "fp32"
    if device.type == "cpu" and amp == "bf16" and not cpu_has_bf16():
        return "fp32"
    if device.type == "cuda" and amp in ("auto", "bf16"):
        # a CUDA plan made where no GPU is visible (tests, planning) assumes an sm80+ GPU: bf16
        return amp_for_sm(cuda_sm(device)) or "bf16"
    return amp


def _graph_blockers(cfg, ops: str, precision: str) -> list[str]:
    """Why this recipe cannot run as one captured CUDA graph (empty: it can)."""
    why = []
    if precision == "fp16":
        # GradScaler checks the gradients for inf on the host and skips the step: not capturable
        why.append("fp16 autocast (its GradScaler decides on the host whether to step; a GPU below sm80)")
    if cfg.parallel != "none":
        why.append(f"--parallel {cfg.parallel} (collectives and hooks outside the graph)")
    if cfg.optimizer in ("sgd", "manual-sgd", "manual-adamw"):
        why.append(f"--optimizer {cfg.optimizer} (only torch's Adam/AdamW and muon are capturable here)")
    if cfg.warmup_batch_size is not None:
        why.append("--warmup-batch-size (one graph has one batch shape)")
    if cfg.compile:
        why.append("--compile")
    return why


def _step_mode(cfg, device: torch.device, ops: str, precision: str) -> str:
    """--step-mode (and the older --compile) resolved: `auto` is cudagraph on CUDA when the recipe
    permits (and the layers are PyTorch's), else compile with --compile, else eager."""
    mode = cfg.step_mode
    if cfg.compile and mode not in ("auto", "compile"):
        raise ConfigError(f"--step-mode {mode}: conflicts with --compile (which is --step-mode compile)")
    if mode == "cudagraph":
        if device.type != "cuda":
            raise ConfigError(
                f"--step-mode cudagraph: CUDA graphs need a CUDA device, not {device} "
                "(use --step-mode eager or compile)"
            )
        blockers = _graph_blockers(cfg, ops, precision)
        if blockers:
            raise ConfigError(f"--step-mode cudagraph: not with {blockers[0]}")
        return mode
    if mode != "auto":
        return mode
    if (
        device.type == "cuda"
        and not _graph_blockers(cfg, ops, precision)
        and ops in ("aten", "fused")
        and cfg.act in CAPTURE_SAFE_ACTS
    ):
        return "cudagraph"
    return "compile" if cfg.compile else "eager"
