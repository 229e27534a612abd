"""A GPT run resolved once, on the machine it runs on: `resolve(config, machine) -> GPTPlan`.

What the user asked (`GPTBenchConfig`: a preset name, a '+'-joined strategy, `--device auto`, an
optional `--seq`) becomes a frozen `GPTPlan` of facts: the model config, the parsed strategy, the
degrees, the per-rank batch and micro-steps, the sequence length, the device type with its compute
capability and cuDNN, the optimizer and its kernel, the SDPA kernel attention will run, and the
planner's predicted peak. Nothing downstream re-derives a setting: the engine, the bench, compare,
the planner and the lab's GPT steps take the plan, and the worker spec *is* the plan as JSON
(`to_dict`/`from_dict` round-trip exactly), so the parent's pre-flight memory check and the worker's
in-run prediction are the same number by construction.

Every check of a run lives in `resolve` (field ranges through `config.validate()`, the strategy's
sizes through `strategy.validate_strategy`, the device against the machine here); `GPTPlan` itself
only checks that its names are ones the engine knows (a spec file is data). This module sits below
`gpt.config` and `gpt.planner` and imports neither: the planner's prediction is handed in as
`predict` (see `GPTBenchConfig.plan`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainlab.device import matmul_precision
from trainlab.errors import ConfigError, HardwareError
from trainlab.gpt.attention_backend import AttentionChoice, choose
from trainlab.gpt.loss import chunked_lm_loss
from trainlab.gpt.model import GPTConfig, get_preset, lm_loss
from trainlab.gpt.parallel.nvme import check_nvme_available
from trainlab.gpt.strategy import Degrees, StrategySpec, parse_strategy, validate_strategy

OPTIMIZERS = ("adamw", "sgd")  # sgd: the equivalence tests' linear update (engine._build_optimizer)
OPTIMIZER_KERNELS = ("fused", "foreach", "forloop")
# plan.loss → the step's loss, (logits [B, T, V], tokens [B, T]) → mean next-token loss; those in
# HIDDEN_STATE_LOSSES take (hidden [B, T, C], LM-head weight, pad mask, tokens) instead and run inside
# the model's forward (gpt.step.HiddenLossStep), so the whole logits never exist.
LOSSES: dict[str, Callable] = {"cross_entropy": lm_loss, "chunked": chunked_lm_loss}
HIDDEN_STATE_LOSSES = frozenset({"chunked"})
IMPLS = ("ours", "hf")


@dataclass(frozen=True)
class Machine:
    """What a run can use: CUDA GPUs (count, compute capability × 10, cuDNN version); a CPU always.
    `detect()` reads this process's machine; the planner and tests describe one by hand."""

    gpus: int = 0
    sm: int | None = None
    cudnn_version: int | None = None
    memory_bytes: int | None = None  # one GPU's memory (CUDA) or the host's (no GPU): --micro-batch-auto's budget

    @classmethod
    def detect(cls) -> Machine:
        if not torch.cuda.is_available():
            try:
                host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            except (ValueError, OSError, AttributeError):
                host = None
            return cls(memory_bytes=host)
        major, minor = torch.cuda.get_device_capability(0)
        return cls(
            torch.cuda.device_count(),
            10 * major + minor,
            torch.backends.cudnn.version(),
            torch.cuda.get_device_properties(0).total_memory,
        )


@dataclass(frozen=True)
class GPTPlan:
    """One GPT training run, resolved: no 'auto', nothing left to parse. Built by `resolve`."""

    model_name: str  # the preset (or "custom" for a model given by hand)
    model: GPTConfig
    impl: str  # ours | hf
    strategy: StrategySpec
    world_size: int  # ranks (processes, one per GPU)
    degrees: Degrees
    global_batch: int  # sequences per optimizer step, identical for every strategy
    per_rank_batch: int  # this rank's slice of it (global / dp)
    micro_batch: int  # sequences per forward/backward (pp: per pipeline micro-batch)
    micro_steps: int  # forward/backwards per optimizer step on a rank (pp: micro-batches)
    seq: int
    pp_schedule: str  # 1f1b | gpipe (used with pp only)
    device: str  # cpu | cuda (a rank's index comes from its local rank)
    sm: int | None  # compute capability × 10 (cuda)
    cudnn_version: int | None
    attention: AttentionChoice  # the SDPA kernel PyTorch runs for this dtype, head width and GPU
    optimizer: str = "adamw"  # adamw | sgd
    optimizer_kernel: str = "forloop"  # fused | foreach | forloop: what the engine asks torch for
    loss: str = "cross_entropy"  # the step's loss function (gpt.step.LOSSES)
    lr: float = 5e-4
    weight_decay: float = 0.0
    seed: int = 0
    tf32: str = "off"
    matmul_precision: str = "highest"  # torch.set_float32_matmul_precision: --matmul-precision, else --tf32 (on = high)
    micro_batch_auto: bool = False  # micro_batch was chosen by the planner (the largest that fits)
    nvme_path: str | None = None
    predicted_peak_bytes: int | None = None  # the planner's per-device peak (None: no model of this run)
    # the benchmark around the step (`gpt bench`): what the worker runs and writes
    steps: int = 10
    warmup: int = 2
    track_memory: bool = False
    json: str | None = None  # PATH, or "-" for stdout
    out: str | None = None
    overwrite: bool = False

    def __post_init__(self):
        for name, value, allowed in (
            ("impl", self.impl, IMPLS),
            ("optimizer", self.optimizer, OPTIMIZERS),
            ("optimizer_kernel", self.optimizer_kernel, OPTIMIZER_KERNELS),
            ("loss", self.loss, LOSSES),
            ("device", self.device, ("cpu", "cuda")),
            ("pp_schedule", self.pp_schedule, ("1f1b", "gpipe")),
        ):
            if value not in allowed:
                raise ConfigError(f"--{name.replace('_', '-')} {value!r}: expected one of {', '.join(allowed)}")
        if self.strategy.data_parallel == "nvme" and self.optimizer != "adamw":
            raise ConfigError(f"--optimizer {self.optimizer}: nvme (DeepSpeed) runs AdamW only")
        # the levers are our model's: HF's has none; tensor parallel splits q, k, v one by one; the
        # pipeline's last stage and DeepSpeed call the loss on logits
        levers = [
            f
            for f, on in (
                ("--vocab-multiple", self.model.vocab_multiple > 1),
                ("--fused-qkv", self.model.fused_qkv),
                ("--loss chunked", self.loss in HIDDEN_STATE_LOSSES),
            )
            if on
        ]
        if levers and self.impl != "ours":
            raise ConfigError(f"{levers[0]}: a lever of our model, not of --impl {self.impl}")
        if self.model.fused_qkv and self.degrees.tp > 1:
            raise ConfigError("--fused-qkv: tensor parallel splits q, k and v separately; drop one of them")
        if self.loss in HIDDEN_STATE_LOSSES and (self.degrees.pp > 1 or self.strategy.data_parallel == "nvme"):
            raise ConfigError(f"--loss {self.loss}: not with pp or nvme (they compute the loss on the logits)")

    # the strategy's modifiers, named as the issue lists the plan's contents
    @property
    def amp(self) -> str | None:
        return self.strategy.amp

    @property
    def checkpointing(self) -> str:
        return self.strategy.ckpt

    @property
    def offload(self) -> bool:
        return self.strategy.offload

    @property
    def pipeline(self) -> bool:
        return self.degrees.pp > 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any, source: str = "gpt plan") -> GPTPlan:
        """The plan a parent wrote (`to_dict`), rebuilt; a damaged file is one ConfigError naming `source`."""
        nested = {"model": GPTConfig, "strategy": StrategySpec, "degrees": Degrees, "attention": AttentionChoice}
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a JSON object of plan fields, got {type(d).__name__}")
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"{source}: unknown plan keys: {', '.join(sorted(unknown))}")
        try:
            return cls(**{k: nested[k](**v) if k in nested else v for k, v in d.items()})
        except TypeError as e:
            raise ConfigError(f"{source}: not a plan trainlab wrote ({e})") from None

    def describe(self) -> dict:
        """The set-up in a line of fields, for logs and the engine's `describe()`."""
        return {
            "strategy": self.strategy.text,
            "impl": self.impl,
            "world_size": self.world_size,
            **dataclasses.asdict(self.degrees),
            "global_batch": self.global_batch,
            "per_rank_batch": self.per_rank_batch,
            "micro_batch": self.micro_batch,
            "micro_steps": self.micro_steps,
            "seq_len": self.seq,
            "amp": self.amp,
            "activation_checkpointing": self.checkpointing,
            "offload": self.offload,
            "compile": self.strategy.compile,
            "optimizer": self.optimizer,
            "device": self.device,
            "attention": self.attention.label,
            "vocab_rows": self.model.padded_vocab,
            "fused_qkv": self.model.fused_qkv,
            "loss": self.loss,
            "micro_batch_auto": self.micro_batch_auto,
        }


def _device_type(flag: str, world_size: int, machine: Machine) -> str:
    """--device auto|cpu|cuda|cuda:N on `machine` → "cpu" | "cuda"."""
    flag = str(flag)
    if flag not in ("auto", "cpu", "cuda") and not flag.startswith("cuda:"):
        raise ConfigError(f"--device {flag!r}: expected auto, cpu or cuda")
    dev = ("cuda" if machine.gpus else "cpu") if flag == "auto" else flag.split(":")[0]
    if dev == "cuda":
        if machine.gpus == 0:
            raise HardwareError(f"--device {flag}: no CUDA GPU is available on this machine")
        if world_size > machine.gpus:
            raise HardwareError(f"--nproc {world_size}: only {machine.gpus} CUDA device(s) visible (one rank per GPU)")
    return dev


def optimizer_kernel(spec: StrategySpec, device: str, fused: bool) -> str:
    """The AdamW kernel the engine runs (the planner counts its temporaries): tp's mix of DTensors and
    plain tensors takes the per-parameter loop; else fused when asked; else torch's default, foreach
    on CUDA and the loop on CPU."""
    if spec.tp:
        return "forloop"
    if fused:
        return "fused"
    return "foreach" if device == "cuda" else "forloop"


MAX_VOCAB_MULTIPLE = 1024


def resolve(
    config,
    machine: Machine,
    *,
    model: GPTConfig | None = None,
    predict: Callable[[GPTPlan], int | None] | None = None,
    usable: Callable[[int], int] | None = None,
) -> GPTPlan:
    """`config` (a `gpt.config.GPTBenchConfig`) on `machine` → the checked, frozen plan.

    `model` replaces the preset (tests, benchmarks of a model that is not one); `predict` is the
    planner's `plan → peak bytes` (`planner.predicted_peak`), attached as `predicted_peak_bytes`;
    `usable` (`planner.usable_bytes`) turns the machine's memory into --micro-batch-auto's budget."""
    config.validate()  # every field's declared range
    if config.micro_batch_auto:
        return largest_fitting(config, machine, model, predict, usable)
    if config.vocab_multiple > MAX_VOCAB_MULTIPLE:
        raise ConfigError(f"--vocab-multiple {config.vocab_multiple}: expected 1 to {MAX_VOCAB_MULTIPLE}")
    model_cfg = model if model is not None else get_preset(config.model)
    model_cfg = dataclasses.replace(model_cfg, vocab_multiple=config.vocab_multiple, fused_qkv=config.fused_qkv)
    spec = parse_strategy(config.strategy)
    seq = config.seq if config.seq is not None else model_cfg.n_positions
    device = _device_type(config.device, config.nproc, machine)
    if device == "cuda" and spec.amp == "bf16" and machine.sm is not None and machine.sm < 80:
        # below Ampere (the course's RTX 2080 Ti, sm75) there is no bf16: not a slow emulation or a crash
        raise HardwareError(
            f"--strategy {spec.text}: bf16: a GPU of sm{machine.sm} has no bf16 (it starts at sm80); "
            f"use fp16 (--strategy {spec.text.replace('amp', 'fp16')}: trainlab adds a GradScaler)"
        )
    if spec.data_parallel == "nvme":
        check_nvme_available(device)
    deg = validate_strategy(
        spec,
        model_cfg,
        config.nproc,
        config.global_batch,
        config.micro_batch,
        tp=config.tp,
        pp=config.pp,
        microbatches=config.microbatches,
        impl=config.impl,
        seq_len=seq,
        pp_schedule=config.pp_schedule,
    )
    per_rank = config.global_batch // deg.dp
    if deg.pp > 1:  # the pipeline splits the per-rank batch into its micro-batches
        steps = config.microbatches if config.microbatches is not None else per_rank // config.micro_batch
        micro = per_rank // steps
    else:
        steps, micro = per_rank // config.micro_batch, config.micro_batch
    sm = machine.sm if device == "cuda" else None
    cudnn = machine.cudnn_version if device == "cuda" else None
    plan = GPTPlan(
        model_name=config.model if model is None else "custom",
        model=model_cfg,
        impl=config.impl,
        strategy=spec,
        world_size=config.nproc,
        degrees=deg,
        global_batch=config.global_batch,
        per_rank_batch=per_rank,
        micro_batch=micro,
        micro_steps=steps,
        seq=seq,
        pp_schedule=config.pp_schedule,
        device=device,
        sm=sm,
        cudnn_version=cudnn,
        attention=choose(model_cfg.head_dim, spec.amp or "fp32", device, sm or 90, cudnn),
        optimizer_kernel=optimizer_kernel(spec, device, config.fused_optimizer),
        loss=config.loss,
        lr=config.lr,
        seed=config.seed,
        tf32=config.tf32,
        matmul_precision=matmul_precision(config.tf32, config.matmul_precision),
        steps=config.steps,
        warmup=config.warmup,
        track_memory=config.track_memory,
        json=config.json,
        out=config.out,
        overwrite=config.overwrite,
    )
    return dataclasses.replace(plan, predicted_peak_bytes=predict(plan)) if predict is not None else plan


def largest_fitting(config, machine: Machine, model: GPTConfig | None, predict, usable) -> GPTPlan:
    """--micro-batch-auto: the plan with the largest micro-batch whose predicted peak fits the machine.
    Candidates divide the global batch, largest first, so a micro-batch that reaches the per-rank batch
    (no accumulation) wins when it fits; each is resolved and checked as a given --micro-batch would be.
    HF's model, which the planner does not model, is sized by ours with the same strategy (a proxy)."""
    if predict is None or usable is None:
        raise ConfigError("--micro-batch-auto: needs the planner (resolve it through GPTBenchConfig.plan)")
    device = _device_type(config.device, config.nproc, machine)
    if machine.memory_bytes is None:
        raise HardwareError(f"--micro-batch-auto: the memory of {device} is unknown; give --micro-batch")
    budget = usable(machine.memory_bytes) if device == "cuda" else machine.memory_bytes // max(1, config.nproc)
    fixed = dataclasses.replace(config, micro_batch_auto=False)
    tried, refused = [], None
    for mb in _divisors_descending(config.global_batch):
        try:
            plan = resolve(dataclasses.replace(fixed, micro_batch=mb), machine, model=model, predict=predict)
        except ConfigError as e:
            refused = e
            continue  # not a micro-batch this strategy can run (accum needs 2+ micro-steps, dp's slice, …)
        peak = plan.predicted_peak_bytes
        if peak is None:
            peak = predict(dataclasses.replace(plan, impl="ours"))
        if peak is None:
            raise ConfigError(f"--micro-batch-auto: the planner does not model --strategy {plan.strategy.text}")
        if peak <= budget:
            return dataclasses.replace(plan, micro_batch_auto=True)
        tried.append(f"{mb}: {peak / 2**30:.1f} GiB")
    if not tried and refused is not None:
        raise refused  # no micro-batch was valid: the reason is a flag's, say it
    raise HardwareError(
        f"--micro-batch-auto: no micro-batch fits {budget / 2**30:.1f} GiB usable on {device} "
        f"(predicted {'; '.join(tried) or 'none valid'})"
    )


def _divisors_descending(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]), reverse=True)
