"""Strategy names, their composition with '+', and the checks that run before anything launches.

A strategy string such as ``zero3+amp+ckpt`` is parsed into a `StrategySpec`: at most one way of
holding the model across data-parallel ranks (ddp, zero1, zero2, zero3, nvme), optional model
parallelism (tp, pp, or both, with or without a data-parallel dimension: one [dp, pp, tp] mesh) and modifiers (amp/bf16/fp16, accum, ckpt,
ckpt-selective, offload, compile). Every impossible combination or size is a `ConfigError` here,
so a bad run fails in the parent process before torchrun starts N workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainlab.errors import ConfigError

# name → one-line meaning (shown in errors and --help).
STRATEGY_HELP = {
    "none": "plain single-process training (the reference every strategy is tested against)",
    "ddp": "DistributedDataParallel: replicated model, gradients all-reduced",
    "zero1": "DDP + ZeroRedundancyOptimizer: optimizer states sharded",
    "zero2": "FSDP2 fully_shard(reshard_after_forward=False): gradients + optimizer states sharded",
    "zero3": "FSDP2 fully_shard(reshard_after_forward=True): parameters sharded too",
    "tp": "DTensor tensor parallel: q/k/v and mlp.fc column-wise, o_proj and mlp.proj row-wise",
    "pp": "torch.distributed.pipelining: blocks split into stages, GPipe or 1F1B",
    "amp": "bf16 autocast (alias of bf16)",
    "bf16": "bf16 autocast, fp32 master weights",
    "fp16": "fp16 autocast with a GradScaler",
    "accum": "gradient accumulation: micro-batch < per-rank batch, no gradient sync on inner micro-steps",
    "ckpt": "activation checkpointing of every transformer block",
    "ckpt-selective": "selective activation checkpointing (see models.gpt.set_activation_checkpointing)",
    "offload": "FSDP2 CPUOffloadPolicy: sharded params, grads and optimizer states live in CPU memory",
    "nvme": "DeepSpeed ZeRO-Infinity: parameters and optimizer states offloaded to NVMe",
    "compile": "torch.compile of every transformer block",
}
STRATEGY_NAMES: list[str] = list(STRATEGY_HELP)

_DATA_PARALLEL = ("ddp", "zero1", "zero2", "zero3", "nvme")
_FSDP = ("zero2", "zero3")


@dataclass(frozen=True)
class StrategySpec:
    """A parsed strategy. `text` is the canonical '+'-joined spelling (used in logs and tables)."""

    text: str = "none"
    data_parallel: str | None = None  # ddp | zero1 | zero2 | zero3 | nvme | None
    tp: bool = False
    pp: bool = False
    amp: str | None = None  # "bf16" | "fp16" | None
    accum: bool = False
    ckpt: str = "none"  # "none" | "full" | "selective"
    offload: bool = False
    compile: bool = False

    @property
    def uses_fsdp(self) -> bool:
        """True when parameters are managed by FSDP2 (zero2/zero3, or offload which implies zero3)."""
        return self.data_parallel in _FSDP

    @property
    def distributed(self) -> bool:
        """True when the strategy needs a process group (more than one rank can take part)."""
        return self.data_parallel not in (None,) or self.tp or self.pp


def _valid_names() -> str:
    return ", ".join(STRATEGY_NAMES)


def parse_strategy(text: str) -> StrategySpec:
    """Parse ``a+b+c`` into a `StrategySpec`; ConfigError for unknown names or impossible combinations."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"--strategy: expected one or more of {_valid_names()} joined by '+', got {text!r}")
    parts = [p.strip().lower() for p in text.split("+")]
    if any(not p for p in parts):
        raise ConfigError(f"--strategy {text!r}: empty name between '+' signs")
    unknown = [p for p in parts if p not in STRATEGY_HELP]
    if unknown:
        raise ConfigError(f"--strategy {text!r}: unknown name {unknown[0]!r}; valid: {_valid_names()}")
    dupes = sorted({p for p in parts if parts.count(p) > 1})
    if dupes:
        raise ConfigError(f"--strategy {text!r}: {dupes[0]!r} given twice")
    if "none" in parts:
        if len(parts) > 1:
            raise ConfigError(f"--strategy {text!r}: 'none' means plain training and cannot be combined")
        return StrategySpec()

    dp = [p for p in parts if p in _DATA_PARALLEL]
    if len(dp) > 1:
        raise ConfigError(f"--strategy {text!r}: {dp[0]} and {dp[1]} are alternative ways to hold the model; pick one")
    data_parallel = dp[0] if dp else None
    amps = [p for p in parts if p in ("amp", "bf16", "fp16")]
    if len(amps) > 1:
        raise ConfigError(f"--strategy {text!r}: pick one precision of amp/bf16/fp16")
    amp = None if not amps else ("fp16" if amps[0] == "fp16" else "bf16")
    ckpts = [p for p in parts if p in ("ckpt", "ckpt-selective")]
    if len(ckpts) > 1:
        raise ConfigError(f"--strategy {text!r}: pick one of ckpt and ckpt-selective")
    ckpt = "none" if not ckpts else ("full" if ckpts[0] == "ckpt" else "selective")
    tp, pp = "tp" in parts, "pp" in parts
    offload, accum, compile_ = "offload" in parts, "accum" in parts, "compile" in parts

    if offload:
        if data_parallel in ("ddp", "zero1", "nvme"):
            raise ConfigError(
                f"--strategy {text!r}: offload is FSDP2's CPUOffloadPolicy; combine it with zero2 or zero3, not {data_parallel}"
            )
        data_parallel = data_parallel or "zero3"  # offload alone = fully sharded + offloaded (works on 1 GPU too)
    if tp or pp:  # data × model parallelism on one [dp, pp, tp] mesh (gpt.parallel.mesh)
        mp = "+".join(n for n, on in (("tp", tp), ("pp", pp)) if on)
        if offload or data_parallel == "nvme":
            raise ConfigError(
                f"--strategy {text!r}: {'offload' if offload else 'nvme'} shards over every rank; "
                f"it does not combine with {mp} (use zero2/zero3+{mp}, or {'offload' if offload else 'nvme'} alone)"
            )
        if data_parallel == "zero1" and tp:
            raise ConfigError(
                f"--strategy {text!r}: ZeroRedundancyOptimizer cannot hold tp's DTensor parameters; "
                f"use zero2+{mp} or zero3+{mp} (FSDP2 shards DTensors), or ddp+{mp}"
            )
        if data_parallel in ("ddp", "zero1") and amp == "fp16":
            raise ConfigError(
                f"--strategy {text!r}: with {mp} the gradients are averaged over the data-parallel ranks after "
                "fp16's overflow check, so one rank could skip a step the others take; use bf16"
            )
    if data_parallel == "nvme" and compile_:
        raise ConfigError(f"--strategy {text!r}: nvme runs inside DeepSpeed's engine; compile is not supported with it")
    if pp and amp == "fp16":
        raise ConfigError(
            f"--strategy {text!r}: fp16 needs a GradScaler to scale the loss inside the pipeline schedule; use bf16 with pp"
        )
    if pp and accum:
        raise ConfigError(
            f"--strategy {text!r}: pp already splits the batch into --microbatches and accumulates; drop accum"
        )

    canonical = "+".join(p for p in STRATEGY_NAMES if p in parts)
    return StrategySpec(
        text=canonical,
        data_parallel=data_parallel,
        tp=tp,
        pp=pp,
        amp=amp,
        accum=accum,
        ckpt=ckpt,
        offload=offload,
        compile=compile_,
    )


@dataclass(frozen=True)
class Degrees:
    """How the world is split: data-parallel × pipeline × tensor-parallel ranks."""

    dp: int
    pp: int
    tp: int


def resolve_degrees(spec: StrategySpec, world_size: int, tp: int = 1, pp: int = 1) -> Degrees:
    """Fill in tp/pp degrees left at 1: `tp` alone uses the whole world, `pp` alone too, `tp+pp`
    puts pp=2 stages and tp=world/2 unless one of them is given. Data parallel gets the rest. With a
    data-parallel strategy beside tp/pp and neither degree given, two replicas share the world
    (dp=2; e.g. ddp+tp+pp on 8 ranks is dp2×pp2×tp2)."""
    if tp < 1 or pp < 1:
        raise ConfigError(f"--tp {tp} / --pp {pp}: degrees must be >= 1")
    if not spec.tp and tp != 1:
        raise ConfigError(f"--tp {tp}: the strategy {spec.text!r} has no tp; add '+tp' or drop --tp")
    if not spec.pp and pp != 1:
        raise ConfigError(f"--pp {pp}: the strategy {spec.text!r} has no pp; add '+pp' or drop --pp")
    model_world = world_size  # the ranks one model replica is split over
    if spec.data_parallel and (spec.tp or spec.pp) and world_size % 2 == 0:
        model_world = world_size // 2
    if spec.tp and spec.pp:
        if tp == 1 and pp == 1:
            pp = 2 if model_world % 2 == 0 else model_world
            tp = max(1, model_world // pp)
        elif tp == 1:
            tp = model_world // pp if model_world % pp == 0 else tp
        elif pp == 1:
            pp = model_world // tp if model_world % tp == 0 else pp
    elif spec.tp and tp == 1:
        tp = model_world
    elif spec.pp and pp == 1:
        pp = model_world
    if world_size % (tp * pp):
        raise ConfigError(f"--nproc {world_size}: not divisible by tp×pp = {tp}×{pp}")
    return Degrees(dp=world_size // (tp * pp), pp=pp, tp=tp)


def validate_strategy(
    spec: StrategySpec,
    model_cfg,
    world_size: int,
    global_batch: int,
    micro_batch: int,
    tp: int = 1,
    pp: int = 1,
    microbatches: int | None = None,
    impl: str = "ours",
    seq_len: int | None = None,
    pp_schedule: str = "1f1b",
) -> Degrees:
    """Raise ConfigError for a strategy and sizes that cannot run together; return the resolved degrees.

    Called by `gpt.plan.resolve` (which checks the device against the machine), once, in the process
    that resolves the run: the parent, before torchrun starts anything.
    """
    if world_size < 1:
        raise ConfigError(f"--nproc {world_size}: expected >= 1")
    if global_batch < 1 or micro_batch < 1:
        raise ConfigError(f"--global-batch {global_batch} / --micro-batch {micro_batch}: expected positive integers")
    if pp_schedule not in ("gpipe", "1f1b"):
        raise ConfigError(f"--pp-schedule {pp_schedule!r}: expected gpipe or 1f1b")
    if impl not in ("ours", "hf"):
        raise ConfigError(f"--impl {impl!r}: expected ours or hf")
    if impl == "hf" and (spec.tp or spec.pp):
        raise ConfigError(
            "--impl hf: HF GPT2 uses Conv1D layers that DTensor tp and our pp split cannot take; use --impl ours"
        )
    if impl == "hf" and spec.ckpt == "selective":
        raise ConfigError("--strategy ckpt-selective: only for --impl ours (HF has whole-block checkpointing only)")

    if not spec.distributed and world_size != 1:
        raise ConfigError(
            f"--nproc {world_size}: strategy {spec.text!r} is single-process; use --nproc 1 or a parallel strategy"
        )
    deg = resolve_degrees(spec, world_size, tp, pp)
    if spec.data_parallel and (spec.tp or spec.pp) and deg.dp < 2:
        raise ConfigError(
            f"--strategy {spec.text}: {world_size} rank(s) split as tp {deg.tp} × pp {deg.pp} leave no second "
            f"data-parallel replica for {spec.data_parallel}; use more ranks (e.g. --nproc {2 * deg.tp * deg.pp}) "
            "or smaller --tp/--pp"
        )
    if spec.tp:
        if deg.tp < 2:
            raise ConfigError(f"--strategy {spec.text}: tp needs a degree >= 2 (got --nproc {world_size}, tp {deg.tp})")
        if model_cfg.n_head % deg.tp:
            raise ConfigError(f"--tp {deg.tp}: must divide the number of heads ({model_cfg.n_head})")
    if spec.pp:
        if deg.pp < 2:
            raise ConfigError(f"--strategy {spec.text}: pp needs >= 2 stages (got --nproc {world_size}, pp {deg.pp})")
        if deg.pp > model_cfg.n_layer:
            raise ConfigError(f"--pp {deg.pp}: more pipeline stages than layers ({model_cfg.n_layer})")
    if seq_len is not None and not 1 < seq_len <= model_cfg.n_positions:
        raise ConfigError(f"--seq {seq_len}: expected 2..{model_cfg.n_positions} (the model's n_positions)")

    if global_batch % deg.dp:
        raise ConfigError(f"--global-batch {global_batch}: not divisible by the {deg.dp} data-parallel ranks")
    per_rank = global_batch // deg.dp
    if per_rank % micro_batch:
        raise ConfigError(
            f"--micro-batch {micro_batch}: must divide the per-rank batch {per_rank} (global {global_batch} / {deg.dp} data-parallel ranks)"
        )
    if spec.accum and per_rank == micro_batch:
        raise ConfigError(
            f"--strategy {spec.text}: accum needs --micro-batch smaller than the per-rank batch {per_rank}"
        )
    if spec.pp:
        n_mb = microbatches if microbatches is not None else per_rank // micro_batch
        if n_mb < 1 or per_rank % n_mb:
            raise ConfigError(f"--microbatches {n_mb}: must divide the per-rank batch {per_rank}")
        if pp_schedule == "1f1b" and n_mb < deg.pp:
            raise ConfigError(f"--microbatches {n_mb}: 1F1B needs at least as many micro-batches as stages ({deg.pp})")
    elif microbatches is not None:
        raise ConfigError(f"--microbatches {microbatches}: only used with pp (use --micro-batch for accumulation)")
    return deg


# data parallelism beside model parallelism on one [dp, pp, tp] mesh (gpt.parallel.mesh), the smallest
# world each needs: two replicas of a model split in two (4 ranks) or in four (8 ranks: dp2×pp2×tp2)
MESH_ROWS = {"ddp+tp": 4, "zero3+tp": 4, "ddp+pp": 4, "zero2+pp": 4, "ddp+tp+pp": 8, "zero3+tp+pp": 8}


def mesh_rows(nproc: int, model=None) -> list[str]:
    """The dp × tp × pp strategies `nproc` ranks can run (for `model`, where given: its heads divide
    the tp degree, its layers the stages), with the degrees `gpt bench` picks by default. The lab's
    multi-GPU plan offers these where it has 4+ GPUs (`gpt compare` and `gpt plan` add them to their
    default matrices)."""
    rows = []
    for name, smallest in MESH_ROWS.items():
        if nproc < smallest or nproc % 2:
            continue
        spec = parse_strategy(name)
        try:
            deg = resolve_degrees(spec, nproc)
        except ConfigError:
            continue
        if deg.dp < 2 or (spec.tp and deg.tp < 2) or (spec.pp and deg.pp < 2):
            continue
        if model is not None and (model.n_head % deg.tp or deg.pp > model.n_layer):
            continue
        rows.append(name)
    return rows
