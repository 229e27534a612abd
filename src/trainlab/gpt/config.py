"""The configs of `trainlab gpt bench|compare|plan`: one dataclass each, flags derived from the fields.

What the user asked, nothing more: `GPTBenchConfig.plan()` resolves it on this machine into the
frozen `gpt.plan.GPTPlan` (with the planner's prediction attached) that everything downstream takes.
`CompareConfig` holds a `GPTBenchConfig` (the settings every strategy shares) instead of repeating its
fields; `gpt compare` takes the bench flags except --strategy/--json/--out, which are per run there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainlab.errors import ConfigError
from trainlab.flags import Config, at_least, json_opt, one_of, opt, output_dir, positive, seed_value
from trainlab.gpt.plan import LOSS_CHOICES, GPTPlan, Machine, attention_layout_problem, resolve
from trainlab.gpt.planner import Resolver, parse_bytes, predicted_peak, predicted_step_seconds, usable_bytes
from trainlab.gpt.shape import PRESETS
from trainlab.gpt.strategy import Degrees, parse_strategy, resolve_degrees
from trainlab.hardware import KNOWN_SM, MATMUL_PRECISIONS, TF32_MODES

MODEL_HELP = "preset: " + ", ".join(PRESETS)
ATTENTION_HELP = (
    "head layout for SDPA: auto | plain | padN (heads stored N wide with zero columns, e.g. pad56, pad64; "
    "auto: padded to a multiple of 8 on a GPU under amp when head_dim is not one, else plain)"
)


@dataclass
class GPTBenchConfig(Config):
    """One strategy, timed on seeded random tokens (`trainlab gpt bench`)."""

    model: str = opt("gpt2-1.6b", MODEL_HELP)
    strategy: str = opt("none", "e.g. none, ddp, zero3+amp+ckpt, tp+pp ('+'-joined; see gpt.strategy)")
    nproc: int = opt(1, "processes, one per GPU (>1 relaunches under torchrun)", check=at_least(1))
    steps: int = opt(10, "timed optimizer steps", check=at_least(1))
    warmup: int = opt(2, "untimed steps before them (compile, allocator, caches)", check=at_least(0))
    global_batch: int = opt(8, "sequences per optimizer step (identical for every strategy)", check=at_least(1))
    micro_batch: int = opt(8, "sequences per forward/backward on one rank", check=at_least(1))
    micro_batch_auto: bool = opt(
        False,
        "instead of --micro-batch: of those the planner predicts fit this device, the fastest it predicts "
        "(no accumulation considered, accum dropped for it; with --attention auto, the plain layout too)",
    )
    seq: int | None = opt(None, "sequence length (default: the model's n_positions)", check=at_least(2))
    vocab_multiple: int = opt(
        1,
        "pad the embedding and LM-head rows to a multiple of this (64: 50257 -> 50304; "
        "the pad logits are masked, the loss is unchanged)",
        check=at_least(1),
    )
    fused_qkv: bool = opt(False, "q, k and v projections as one GEMM (not with tp)")
    attention: str = opt("auto", ATTENTION_HELP, check=attention_layout_problem)
    loss: str = opt(
        "auto",
        "auto | cross_entropy | chunked (the LM head and the loss in 4096-token chunks: the [B, T, V] logits "
        "never exist whole); auto: chunked only where the planner predicts the whole logits do not fit",
        choices=LOSS_CHOICES,
    )
    residual_16bit: bool = opt(
        False, "under amp, the residual stream in autocast's 16-bit dtype (LayerNorm statistics stay fp32)"
    )
    fused_boundary: bool = opt(
        False, "each block's last residual add and the next LayerNorm in one function (one kernel under compile)"
    )
    cast_once: bool = opt(
        False, "under amp, the blocks' 16-bit weights made once per optimizer step, not at every micro-step"
    )
    fp8: bool = opt(
        False,
        "torchao float8 training of the block Linears (CUDA sm89+, bf16 and compile; pip install 'trainlab[fp8]')",
    )
    device: str = opt("auto", "auto | cpu | cuda")
    impl: str = opt("ours", "ours | hf (HF GPT2LMHeadModel, the handout's baseline)", choices=("ours", "hf"))
    tp: int = opt(1, "tensor-parallel degree (with tp; default: all ranks)", check=at_least(1))
    pp: int = opt(1, "pipeline stages (with pp; default: all ranks)", check=at_least(1))
    pp_schedule: str = opt("1f1b", "1f1b | gpipe", check=one_of(("1f1b", "gpipe")))
    microbatches: int | None = opt(
        None, "pipeline micro-batches (default: per-rank batch / micro-batch)", check=at_least(1)
    )
    lr: float = opt(5e-4, "learning rate (the handout's)", check=positive)
    seed: int = opt(0, "seed of the weights and the tokens", check=seed_value)
    fused_optimizer: bool = opt(False, "AdamW(fused=True) (GPU)")
    tf32: str = opt(
        "off", "TF32 tensor cores for fp32 matmuls on Ampere+ GPUs (recorded in the summary)", choices=TF32_MODES
    )
    matmul_precision: str | None = opt(
        None,
        "float32 matmul precision (torch.set_float32_matmul_precision): highest (fp32) | high (TF32, = --tf32 on) "
        "| medium (bf16 passes allowed); default: what --tf32 says",
        metavar="highest|high|medium",
        check=one_of(MATMUL_PRECISIONS),
    )
    track_memory: bool = opt(False, "one extra, untimed step counting live tensor bytes (CPU: the exact peak)")
    json: str | None = json_opt("write the summary JSON to PATH ('-': print it to stdout, the log goes to stderr)")
    out: str | None = opt(
        None, "run directory: config, env, metrics.jsonl, TensorBoard, summary (new or empty unless --overwrite)"
    )
    overwrite: bool = opt(
        False, "replace the run already in --out (its files are deleted when this run starts writing)"
    )

    def plan(self, machine: Machine | None = None, model=None) -> GPTPlan:
        """This run resolved on `machine` (default: this one) with the planner's predicted peak attached;
        every check of a run happens here (`gpt.plan.resolve`), before anything launches."""
        return resolve(
            self,
            machine or Machine.detect(),
            model=model,
            predict=predicted_peak,
            usable=usable_bytes,
            seconds=predicted_step_seconds,
        )


@dataclass
class CompareConfig(Config):
    """A matrix of strategies on the same tokens, one process each (`trainlab gpt compare`)."""

    bench: GPTBenchConfig = opt(None, "the settings every strategy shares", cli=False)
    strategies: str | None = opt(None, "comma-separated list (default: the handout's list and combinations)")
    out: str = opt("runs/gpt_compare", "directory for tables, plots and logs", check=output_dir)
    timeout_s: float = opt(1800.0, "seconds per strategy", flag="--timeout", check=positive)
    budget_s: float | None = opt(
        None,
        "seconds for the whole comparison: each row's --timeout is cut to what is left, later rows are skipped",
        flag="--budget",
        check=positive,
    )
    gpu_mem: int | None = opt(
        None, "device memory for the prediction's 'fits' (default: the GPU's)", cli=False, check=at_least(1)
    )

    def __post_init__(self):
        if self.bench is None:
            self.bench = GPTBenchConfig()

    @property
    def strategy_list(self) -> list[str] | None:
        return [s for s in self.strategies.split(",") if s] if self.strategies else None


# `gpt compare` takes the shared bench flags; these are per strategy run there.
COMPARE_EXCLUDED_BENCH_FLAGS = ("strategy", "json", "out", "overwrite")


def _size_problem(text: str) -> str | None:
    """What is wrong with a memory size such as 80GiB (parse_bytes owns the format), or None."""
    try:
        parse_bytes(text)
    except ConfigError as e:
        return str(e).split(": ", 1)[-1]
    return None


@dataclass
class PlanConfig(Config):
    """Predicted per-device memory of every strategy (`trainlab gpt plan`)."""

    model: str = opt("gpt2-1.6b", MODEL_HELP)
    gpus: int = opt(1, "devices to plan for", check=at_least(1))
    gpu_mem: str = opt("80GiB", "memory per device, e.g. 80GiB, 40GB", check=_size_problem)
    micro_batch: int = opt(1, "sequences per forward/backward on one rank", check=at_least(1))
    seq: int | None = opt(None, "sequence length (default: the model's n_positions)", check=at_least(2))
    strategies: str | None = opt(None, "comma-separated list (default: a matrix for --gpus)")
    optimizer: str = opt(
        "foreach", "AdamW implementation (its temporaries differ)", choices=("foreach", "fused", "forloop")
    )
    sm: int = opt(
        90,
        "GPU compute capability x10 (90 H100/H200, 80 A100): decides the attention kernel SDPA runs",
        check=one_of(KNOWN_SM),
    )
    vocab_multiple: int = opt(1, "as gpt bench: embedding rows padded to a multiple of this", check=at_least(1))
    fused_qkv: bool = opt(False, "as gpt bench: q, k, v as one Linear")
    attention: str = opt("auto", "as gpt bench: " + ATTENTION_HELP, check=attention_layout_problem)
    loss: str = opt("auto", "as gpt bench: auto | cross_entropy | chunked", choices=LOSS_CHOICES)
    residual_16bit: bool = opt(False, "as gpt bench: the residual stream in 16-bit under amp")
    cast_once: bool = opt(False, "as gpt bench: 16-bit block weights made once per optimizer step (amp)")
    json: str | None = json_opt("write the plan as JSON to PATH ('-': print it instead of the table)")

    @property
    def strategy_list(self) -> list[str] | None:
        return [s for s in self.strategies.split(",") if s] if self.strategies else None

    def resolver(self) -> Resolver:
        """strategy, micro-batch → the plan of that run on --gpus GPUs of compute capability --sm: the
        planner sees exactly what `gpt bench` would run (single-device strategies on one GPU; no
        accumulation; pp with 2 micro-batches per stage to keep the bubble small)."""
        machine = Machine(gpus=self.gpus, sm=self.sm, memory_bytes=parse_bytes(self.gpu_mem))

        def plan_of(strategy: str, micro_batch: int) -> GPTPlan:
            spec = parse_strategy(strategy)
            world = self.gpus if spec.distributed else 1
            deg = resolve_degrees(spec, world)
            n_mb = 2 * deg.pp if spec.pp else 1
            run = GPTBenchConfig(
                model=self.model,
                strategy=strategy,
                nproc=world,
                device="cuda",
                global_batch=micro_batch * n_mb * (deg.dp if spec.data_parallel else 1),
                micro_batch=micro_batch,
                seq=self.seq,
                fused_optimizer=self.optimizer == "fused",
                vocab_multiple=self.vocab_multiple,
                fused_qkv=self.fused_qkv and not spec.tp,
                attention=self.attention if not spec.tp else "plain",
                loss=self.loss if not spec.pp else "cross_entropy",
                # the 16-bit levers only where they can run (amp; not pp; cast_once: single device or ddp)
                residual_16bit=self.residual_16bit and spec.amp is not None and not spec.pp,
                cast_once=self.cast_once
                and spec.amp is not None
                and spec.data_parallel in (None, "ddp")
                and not (spec.tp or spec.pp),
            )
            p = run.plan(machine)
            if self.optimizer == "forloop" and p.optimizer_kernel != "forloop":  # no bench flag asks for it
                p = replace(p, optimizer_kernel="forloop")
                p = replace(p, predicted_peak_bytes=predicted_peak(p))
            return p

        return plan_of


@dataclass
class ProfileConfig(Config):
    """`gpt profile`'s own flags; the run is `gpt bench`'s (the same flags, `GPTBenchConfig`)."""

    bench: GPTBenchConfig = opt(None, "the run to profile", cli=False)
    profile_steps: int = opt(2, "optimizer steps under the profiler", check=at_least(1))
    trace: str | None = opt(None, "also write a Chrome trace (chrome://tracing, Perfetto) to this file")
    json: str | None = json_opt("write the profile as JSON to PATH ('-': print it instead of the table)")

    def __post_init__(self):
        if self.bench is None:
            self.bench = GPTBenchConfig()


# `gpt profile` takes the bench flags but these, which are the bench's outputs
PROFILE_EXCLUDED_BENCH_FLAGS = ("json", "out", "overwrite", "track_memory", "steps")


def plan_for_strategy(bench: GPTBenchConfig, strategy: str) -> GPTBenchConfig:
    """The one per-strategy rule (`gpt compare`, the lab's planned rows): parallel strategies use all
    `nproc` ranks, single-device ones one; accumulation gets a micro-batch half the per-rank batch; a
    pipeline at least as many micro-batches as stages; --tp/--pp only where the strategy has them; the
    tokens stay identical."""
    spec = parse_strategy(strategy)
    nproc = bench.nproc if spec.distributed else 1
    tp, pp = (bench.tp if spec.tp else 1), (bench.pp if spec.pp else 1)
    try:
        deg = resolve_degrees(spec, nproc, tp, pp)
    except ConfigError:  # the row's own check reports it as "invalid" (run_one)
        deg = Degrees(dp=nproc if spec.data_parallel else 1, pp=pp, tp=tp)
    per_rank = bench.global_batch // max(1, deg.dp)
    micro = min(bench.micro_batch, max(1, per_rank))
    if spec.pp and deg.pp > 1:
        micro = min(micro, max(1, per_rank // deg.pp))  # 1F1B needs micro-batches >= stages
    if spec.accum and micro >= per_rank:
        micro = max(1, micro // 2)
    # on CPU, RSS is mostly the runtime: count live tensor bytes too (one extra untimed step)
    on_cpu = bench.device == "cpu" or (bench.device == "auto" and Machine.detect().gpus == 0)
    return replace(
        bench,
        strategy=spec.text,
        nproc=nproc,
        tp=tp,
        pp=pp,
        micro_batch=micro,
        json=None,
        out=None,
        track_memory=bench.track_memory or on_cpu,
    )
