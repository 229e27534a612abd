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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainlab.errors import ConfigError, HardwareError
from trainlab.gpt.attention_backend import AttentionChoice, choose
from trainlab.gpt.parallel.nvme import check_nvme_available
from trainlab.gpt.shape import GPTConfig, get_preset
from trainlab.gpt.strategy import Degrees, StrategySpec, parse_strategy, validate_strategy
from trainlab.hardware import Machine, matmul_precision

OPTIMIZERS = ("adamw", "sgd")  # sgd: the equivalence tests' linear update (engine._build_optimizer)
OPTIMIZER_KERNELS = ("fused", "foreach", "forloop")
# plan.loss: the step's loss (gpt.step.LOSS_FUNCTIONS), (logits [B, T, V], tokens [B, T]) → mean
# next-token loss; those in HIDDEN_STATE_LOSSES take (hidden [B, T, C], LM-head weight, pad mask, tokens)
# instead and run inside the model's forward (gpt.step.HiddenLossStep), so the whole logits never exist.
LOSSES = ("cross_entropy", "chunked")
HIDDEN_STATE_LOSSES = frozenset({"chunked"})
# --loss auto: the planner's choice, resolved into one of LOSSES (`choose_loss`)
LOSS_CHOICES = ("auto", *LOSSES)
IMPLS = ("ours", "hf")
MAX_HEAD_WIDTH = 256  # flash's and cuDNN's limit (attention_backend)


def attention_layout_problem(text) -> str | None:
    """What is wrong with an --attention value (its syntax only; the model decides the rest), or None."""
    if text in ("auto", "plain"):
        return None
    if isinstance(text, str) and text.startswith("pad") and text[3:].isdigit():
        width = int(text[3:])
        if width % 8 == 0 and 8 <= width <= MAX_HEAD_WIDTH:
            return None
    return f"expected auto, plain or padN with N a multiple of 8 up to {MAX_HEAD_WIDTH} (e.g. pad56, pad64)"


def head_dim_padded(text: str, head_dim: int, spec: StrategySpec, device: str, sm: int | None, impl: str) -> int:
    """--attention → `GPTConfig.head_dim_padded` (0: the plain layout).

    auto: padded to the next multiple of 8 on a CUDA GPU of sm80+ under bf16/fp16 autocast when head_dim
    is not one (GPT-2 1.6B's 50 → 56), plain everywhere else (the CPU's flash kernel takes any width).
    Why 56: issue 35's micro-measurement on one H200 (torch 2.11, causal [16, 32, 1024, d] bf16, forward +
    backward, per step × 48 layers): head_dim-50 views of the fused projection 131.6 ms (flash; cuDNN
    refuses 50), F.pad to 56 per call 88.1 ms (cuDNN), contiguous heads already 56 wide 55.5 ms (cuDNN)
    and 85.0 ms (flash); 64 wide per call 89.0 ms. Not yet measured for fp16, sm80 or the whole step: the
    GPU script (benchmarks/gpu_gpt.py) measures the table and the step both ways."""
    problem = attention_layout_problem(text)
    if problem:
        raise ConfigError(f"--attention {text!r}: {problem}")
    if text == "auto":
        fast = device == "cuda" and spec.amp is not None and (sm or 0) >= 80 and impl == "ours" and not spec.tp
        return -(-head_dim // 8) * 8 if fast and head_dim % 8 else 0
    if text == "plain":
        return 0
    width = int(text[3:])
    if width < head_dim:
        raise ConfigError(f"--attention {text}: narrower than the model's head_dim {head_dim}")
    return 0 if width == head_dim else width


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
    micro_batch_auto: bool = False  # micro_batch was chosen by the planner (the fastest predicted that fits)
    fp8: bool = False  # torchao float8 training of the block Linears (model.float8_block_linears)
    cast_once: bool = False  # the blocks' 16-bit weights made once per optimizer step (model.cast_weights_once)
    nvme_path: str | None = None
    predicted_peak_bytes: int | None = None  # the planner's per-device peak (None: no model of this run)
    predicted_step_ms: float | None = None  # the planner's roofline estimate (planner.predicted_step_seconds)
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
                (f"--attention {self.model.attention_layout}", self.model.head_dim_padded > 0),
                ("--residual-16bit", self.model.residual_16bit),
                ("--fused-boundary", self.model.fused_boundary),
                ("--cast-once", self.cast_once),
            )
            if on
        ]
        if levers and self.impl != "ours":
            raise ConfigError(f"{levers[0]}: a lever of our model, not of --impl {self.impl}")
        if self.model.fused_qkv and self.degrees.tp > 1:
            raise ConfigError("--fused-qkv: tensor parallel splits q, k and v separately; drop one of them")
        if self.model.head_dim_padded and self.degrees.tp > 1:
            raise ConfigError(f"--attention {self.model.attention_layout}: not with tp (use --attention plain)")
        if self.loss in HIDDEN_STATE_LOSSES and (self.degrees.pp > 1 or self.strategy.data_parallel == "nvme"):
            raise ConfigError(f"--loss {self.loss}: not with pp or nvme (they compute the loss on the logits)")
        self._check_glue()

    def _check_glue(self) -> None:
        """Issue 35's glue levers: the 16-bit ones need autocast; the residual's dtype is fixed where pipeline
        stages meet; the fused boundary reads the next block's LayerNorm and the weight cache swaps the blocks'
        Linears, which FSDP's shards and tp's DTensors do not allow (single device or ddp)."""
        plain_dp = self.strategy.data_parallel in (None, "ddp") and self.degrees.tp == 1 and self.degrees.pp == 1
        for flag, on, needs_amp, only_plain_dp in (
            ("--residual-16bit", self.model.residual_16bit, True, False),
            ("--fused-boundary", self.model.fused_boundary, False, True),
            ("--cast-once", self.cast_once, True, True),
        ):
            if not on:
                continue
            if needs_amp and self.amp is None:
                raise ConfigError(
                    f"{flag}: needs amp (autocast's 16-bit dtype); --strategy {self.strategy.text} has none"
                )
            if only_plain_dp and not plain_dp:
                raise ConfigError(f"{flag}: single device or ddp only, not --strategy {self.strategy.text}")
            if flag == "--residual-16bit" and self.degrees.pp > 1:
                raise ConfigError(f"{flag}: not with pp (the stages exchange the residual stream)")
        if self.cast_once and self.fp8:
            raise ConfigError("--cast-once: not with --fp8 (torchao casts the block Linears to FP8 itself)")

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
            "attention_layout": self.model.attention_layout,
            "vocab_rows": self.model.padded_vocab,
            "fused_qkv": self.model.fused_qkv,
            "loss": self.loss,
            "residual_16bit": self.model.residual_16bit,
            "fused_boundary": self.model.fused_boundary,
            "cast_once": self.cast_once,
            "micro_batch_auto": self.micro_batch_auto,
            "fp8": self.fp8,
        }


FP8_MIN_SM = 89  # FP8 tensor cores: Ada (sm89) and Hopper (sm90) onwards


def fp8_problem(machine: Machine) -> str | None:
    """Why `--fp8` cannot run on `machine` (one line), or None: torchao importable and an sm89+ GPU."""
    import importlib.util

    # the hardware first: no install makes an sm80 GPU run FP8
    if not machine.gpus or (machine.sm or 0) < FP8_MIN_SM:
        where = f"sm{machine.sm}" if machine.gpus else "no CUDA GPU"
        return f"FP8 tensor cores need a CUDA GPU of sm{FP8_MIN_SM}+ ({where} here)"
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not importable here (pip install 'trainlab[fp8]': torchao 0.18)"
    return None


def _check_fp8(spec: StrategySpec, impl: str, device: str, machine: Machine) -> None:
    problem = fp8_problem(machine) if device == "cuda" else "FP8 tensor cores need --device cuda"
    if problem:
        raise HardwareError(f"--fp8: {problem}")
    if impl != "ours" or spec.amp != "bf16" or not spec.compile or spec.tp or spec.pp or spec.uses_fsdp:
        raise ConfigError(
            "--fp8: for --impl ours with bf16 and compile (e.g. --strategy amp+compile), single device or ddp "
            "(torchao's float8 Linears under FSDP/tp/pp need their own set-up, not written)"
        )


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
    seconds: Callable[[GPTPlan], float] | None = None,
) -> GPTPlan:
    """`config` (a `gpt.config.GPTBenchConfig`) on `machine` → the checked, frozen plan.

    `model` replaces the preset (tests, benchmarks of a model that is not one); `predict` is the
    planner's `plan → peak bytes` (`planner.predicted_peak`), attached as `predicted_peak_bytes`;
    `usable` (`planner.usable_bytes`) turns the machine's memory into --micro-batch-auto's budget;
    `seconds` (`planner.predicted_step_seconds`) estimates the step, attached as `predicted_step_ms`."""
    config.validate()  # every field's declared range
    if config.micro_batch_auto:
        return fastest_fitting(config, machine, model, predict, usable, seconds)
    if config.vocab_multiple > MAX_VOCAB_MULTIPLE:
        raise ConfigError(f"--vocab-multiple {config.vocab_multiple}: expected 1 to {MAX_VOCAB_MULTIPLE}")
    model_cfg = model if model is not None else get_preset(config.model)
    spec = parse_strategy(config.strategy)
    device = _device_type(config.device, config.nproc, machine)
    padded = head_dim_padded(config.attention, model_cfg.head_dim, spec, device, machine.sm, config.impl)
    model_cfg = dataclasses.replace(
        model_cfg,
        vocab_multiple=config.vocab_multiple,
        fused_qkv=config.fused_qkv,
        head_dim_padded=padded,
        residual_16bit=config.residual_16bit,
        fused_boundary=config.fused_boundary,
    )
    seq = config.seq if config.seq is not None else model_cfg.n_positions
    if device == "cuda" and spec.amp == "bf16" and machine.sm is not None and machine.sm < 80:
        # below Ampere (the course's RTX 2080 Ti, sm75) there is no bf16: not a slow emulation or a crash
        raise HardwareError(
            f"--strategy {spec.text}: bf16: a GPU of sm{machine.sm} has no bf16 (it starts at sm80); "
            f"use fp16 (--strategy {spec.text.replace('amp', 'fp16')}: trainlab adds a GradScaler)"
        )
    if spec.data_parallel == "nvme":
        check_nvme_available(device)
    if config.fp8:
        _check_fp8(spec, config.impl, device, machine)
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
        attention=choose(model_cfg.head_width, spec.amp or "fp32", device, sm or 90, cudnn),
        optimizer_kernel=optimizer_kernel(spec, device, config.fused_optimizer),
        loss="cross_entropy" if config.loss == "auto" else config.loss,
        fp8=config.fp8,
        cast_once=config.cast_once,
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
    if config.loss == "auto":
        plan = choose_loss(plan, machine, predict, usable)
    if predict is not None:
        plan = dataclasses.replace(plan, predicted_peak_bytes=predict(plan))
    if seconds is not None:
        plan = dataclasses.replace(plan, predicted_step_ms=round(1e3 * seconds(plan), 3))
    return plan


def _budget(machine: Machine, device: str, nproc: int, usable: Callable[[int], int] | None) -> int | None:
    """Bytes a rank's step may use: the GPU's usable memory, or its share of the host's; None if unknown."""
    if machine.memory_bytes is None or (device == "cuda" and usable is None):
        return None
    return usable(machine.memory_bytes) if device == "cuda" else machine.memory_bytes // max(1, nproc)


def choose_loss(plan: GPTPlan, machine: Machine, predict, usable) -> GPTPlan:
    """--loss auto: the whole logits where the planner predicts they fit (one cross-entropy over them, no
    chunk loop), the chunked loss where only it fits (it keeps one 4096-token chunk of logits instead of
    the [B, T, V] logits and their gradients) and our model can run it (not hf, pp or nvme); the whole
    logits where the memory or the prediction is unknown."""
    budget = _budget(machine, plan.device, plan.world_size, usable)
    peak = predict(plan) if predict is not None and budget is not None else None
    chunked_ok = plan.impl == "ours" and plan.degrees.pp == 1 and plan.strategy.data_parallel != "nvme"
    if peak is not None and peak > budget and chunked_ok:
        return dataclasses.replace(plan, loss="chunked")
    return plan


def _candidates(config, machine: Machine):
    """--micro-batch-auto's candidate runs: every micro-batch dividing the global batch, largest first; with
    `accum`, the one that is the whole per-rank batch without it (no accumulation is a candidate too: issue
    35's 1.6B run took 8 × 2 at 412 → 445 ms because accum refused 16 × 1); with --attention auto where it
    pads, the plain layout too (it needs less memory, so a larger micro-batch may fit)."""
    spec = parse_strategy(config.strategy)
    layouts = [config.attention]
    if config.attention == "auto":
        layouts.append("plain")
    for mb in _divisors_descending(config.global_batch):
        for layout in layouts:
            run = dataclasses.replace(config, micro_batch_auto=False, micro_batch=mb, attention=layout)
            if spec.accum:
                without = "+".join(p for p in spec.text.split("+") if p != "accum") or "none"
                yield dataclasses.replace(run, strategy=without)
            yield run


def fastest_fitting(config, machine: Machine, model: GPTConfig | None, predict, usable, seconds=None) -> GPTPlan:
    """--micro-batch-auto: of the candidate plans (`_candidates`) whose predicted peak fits the machine, the
    fastest by the planner's estimate (`seconds`; without one, the first: the largest micro-batch). Each is
    resolved and checked as the same flags given by hand would be. HF's model, which the planner does not
    model, is sized by ours with the same strategy (a proxy)."""
    if predict is None or usable is None:
        raise ConfigError("--micro-batch-auto: needs the planner (resolve it through GPTBenchConfig.plan)")
    device = _device_type(config.device, config.nproc, machine)
    if machine.memory_bytes is None:
        raise HardwareError(f"--micro-batch-auto: the memory of {device} is unknown; give --micro-batch")
    budget = _budget(machine, device, config.nproc, usable)
    tried, refused, fitting, seen = [], None, [], set()
    for run in _candidates(config, machine):
        try:
            plan = resolve(run, machine, model=model, predict=predict, seconds=seconds)
        except ConfigError as e:
            refused = e
            continue  # not a micro-batch this strategy can run (accum needs 2+ micro-steps, dp's slice, …)
        key = (plan.micro_batch, plan.strategy.text, plan.model.head_dim_padded)
        if key in seen:  # auto that resolves plain is the plain candidate again
            continue
        seen.add(key)
        peak = plan.predicted_peak_bytes
        if peak is None:
            peak = predict(dataclasses.replace(plan, impl="ours"))
        if peak is None:
            raise ConfigError(f"--micro-batch-auto: the planner does not model --strategy {plan.strategy.text}")
        if peak <= budget:
            fitting.append(plan)
        else:
            tried.append(f"{plan.micro_batch}: {peak / 2**30:.1f} GiB")
    if fitting:
        # min keeps the first of equals: the largest micro-batch, the asked layout and strategy
        best = min(fitting, key=lambda p: p.predicted_step_ms if p.predicted_step_ms is not None else 0.0)
        return dataclasses.replace(best, micro_batch_auto=True)
    if not tried and refused is not None:
        raise refused  # no micro-batch was valid: the reason is a flag's, say it
    raise HardwareError(
        f"--micro-batch-auto: no micro-batch fits {budget / 2**30:.1f} GiB usable on {device} "
        f"(predicted {'; '.join(tried) or 'none valid'})"
    )


def _divisors_descending(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]), reverse=True)
