"""Memory planner: per-device bytes of one GPT training step for a strategy, before running it.

The model follows what `trainlab.gpt.engine.GPTEngine` actually does (fp32 master weights,
AdamW with fp32 m and v, bf16 autocast for `amp`, DDP gradient buckets, FSDP2 per-block groups,
DTensor TP of the blocks with replicated embeddings, pipeline stages that cut the blocks).

Activations use Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models") bookkeeping, redone for *this* model: no dropout and `scaled_dot_product_attention`, so
with a fused kernel (flash / memory-efficient / cuDNN keep no s×s matrices) the paper's per-layer
s·b·h·(34 + 5·a·s/h) bytes (16-bit, with dropout) becomes, per token and layer,

    h·(2·r + 14·p)   bytes      (r = residual-stream bytes, p = matmul-activation bytes)

= LN1 input r + LN1 output p + q,k,v 3p + attention output p + LN2 input r + LN2 output p + fc
output 4p + GELU output 4p. fp32: 64·h; bf16 autocast (fp32 residual): 36·h. Which kernel SDPA runs
is decided as PyTorch decides it (`gpt.attention_backend`), and two of its choices add to this:
  * math (e.g. fp32 with head_dim 50: no fused kernel accepts it): the softmax probabilities,
    heads·s·p bytes per token and layer, are kept for backward (and two such tensors are temporaries
    while a layer's attention backward runs) — the paper's 5·a·s/h term, without dropout;
  * flash with a head width that is not a multiple of 8 (50 → 56): SDPA pads q, k, v; backward
    keeps the padded q, k, v and output (4·p·heads·padded) and the output projection a compact copy
    (p·h), instead of q, k, v and the output once (4·p·h).
Full recompute keeps
only the block input (r·h; the paper's 2sbh) plus one recomputed layer at a time; our selective
mode (MLP recomputed) keeps h·(2r + 5p). Tensor parallel divides the head/MLP-wide tensors by t
(the paper's 10 + 24/t); sequence parallel divides everything by t. The paper's own numbers are
reported alongside (`korthikanti_layer_bytes`).

Peak memory is predicted as the largest of three moments of the step:
  A. start of backward: weights, optimizer states, all saved activations and the loss's
     [b, s, V] gradient temporaries;
  C. during backward (walked layer by layer): gradients produced so far + activations not yet freed
     (+ the recomputed layer with checkpointing, + unsharded FSDP parameters);
  B. optimizer step: weights + gradients + optimizer states + the optimizer's temporaries.
`total_bytes` is that peak; `sum_bytes` (every component at once) is the conservative bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainlab.errors import ConfigError, HardwareError
from trainlab.gpt.attention_backend import AttentionChoice, choose
from trainlab.gpt.plan import GPTPlan
from trainlab.gpt.shape import CHUNK_TOKENS, GPTConfig, count_params
from trainlab.gpt.strategy import StrategySpec, mesh_rows, parse_strategy, resolve_degrees

GiB = 1024**3
FP32 = 4
# Fraction of device memory kept free for the caching allocator's fragmentation, and a fixed
# reserve for the CUDA context / NCCL buffers, which max_memory_allocated does not count.
FRAGMENTATION_MARGIN = 0.05
CONTEXT_RESERVE_BYTES = 1 * GiB


def parse_bytes(text: str | int | float, flag: str = "--gpu-mem") -> int:
    """'80GiB', '80GB', '512MiB', '1e9' → bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    s = str(text).strip()
    # a unit is required: a bare "80" would plan for 80 bytes (and "fit" nothing) without a word
    units = {
        "tib": 1024**4,
        "gib": GiB,
        "mib": 1024**2,
        "kib": 1024,
        "tb": 10**12,
        "gb": 10**9,
        "mb": 10**6,
        "kb": 10**3,
        "t": 1024**4,
        "g": GiB,
        "m": 1024**2,
        "k": 1024,
        "b": 1,
    }
    num = s.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    unit = s[len(num) :].strip().lower()
    try:
        value = float(num)
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected a size such as 80GiB, 40GB or 512MiB") from None
    if not unit:
        raise ConfigError(
            f"{flag} {text!r}: expected a size with a unit, such as 80GiB, 40GB or 512MiB "
            f"(a bare number would be bytes: write {text}B if you mean that)"
        )
    if unit not in units or not 0 < value * units.get(unit, 1) < 2**63:  # NaN, inf and 1e400 fail here too
        raise ConfigError(f"{flag} {text!r}: expected a size such as 80GiB, 40GB or 512MiB")
    return int(value * units[unit])


def _spec(strategy):
    return strategy if isinstance(strategy, StrategySpec) else parse_strategy(strategy)


# ----------------------------------------------------------------------------------------------
# per-layer quantities


def layer_param_count(cfg: GPTConfig, tp: int = 1) -> int:
    """Parameters of one block held by one TP rank (column-split q/k/v/fc with their biases,
    row-split o_proj/proj weights; LayerNorms and row-wise biases replicated). The padded head layout
    stores q/k/v rows and o_proj columns head_width wide (`GPTConfig.head_dim_padded`)."""
    h, a = cfg.n_embd, cfg.n_head * cfg.head_width
    split = (3 * a * h + 3 * a) + (h * a) + (4 * h * h + 4 * h) + (4 * h * h)
    replicated = 4 * h + h + h  # 2 LayerNorms, o_proj bias, proj bias
    return split // tp + replicated


def layer_linear_param_count(cfg: GPTConfig, tp: int = 1) -> int:
    """Parameters of one block that autocast casts to 16-bit (all Linear weights and biases)."""
    return layer_param_count(cfg, tp) - 4 * cfg.n_embd


def attention_extra_bytes_per_token(
    cfg: GPTConfig, act_bytes: int, seq_len: int, attention: AttentionChoice | None, tp: int = 1
) -> float:
    """What the attention kernel keeps for backward beyond q, k, v and the output once (per token
    and layer, this TP rank): the math path's s×s probabilities, flash's padded copies, the padded
    layout's wider q, k, v and attention output."""
    heads, p = cfg.n_head / tp, act_bytes
    extra = 4 * p * heads * (cfg.head_width - cfg.head_dim)  # padded layout: q, k, v, output head_width wide
    if attention is None:
        return extra
    if attention.stores_scores:
        extra += heads * seq_len * p
    if attention.padded_head_dim != attention.head_dim:
        extra += 4 * p * heads * (attention.padded_head_dim - attention.head_dim) + p * cfg.n_embd / tp
    return extra


def layer_activation_bytes_per_token(
    cfg: GPTConfig,
    ckpt: str,
    residual_bytes: int,
    act_bytes: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    attention: AttentionChoice | None = None,
    seq_len: int | None = None,
) -> float:
    """Bytes one layer keeps for backward, per token of the micro-batch (see module docstring);
    `attention` (with `seq_len`) adds what a non-fused or padded attention kernel keeps."""
    h, r, p, t = cfg.n_embd, residual_bytes, act_bytes, tp
    heads = cfg.n_head / t
    small = 2 * 2 * FP32 + FP32 * heads  # LayerNorm mean/rstd ×2, attention log-sum-exp per head
    sp = t if sequence_parallel else 1  # sequence parallel also splits the h-wide tensors
    if ckpt == "full":
        return r * h / sp
    extra = attention_extra_bytes_per_token(cfg, p, seq_len or cfg.n_positions, attention, t)
    if ckpt == "selective":
        return (2 * r * h + p * h) / sp + 4 * p * h / t + small + extra
    return (2 * r * h + 2 * p * h) / sp + 12 * p * h / t + small + extra


def korthikanti_layer_bytes(
    cfg: GPTConfig,
    micro_batch: int,
    seq_len: int,
    tp: int = 1,
    recompute: str = "none",
    sequence_parallel: bool = False,
) -> float:
    """The paper's per-layer activation bytes (16-bit, with dropout, non-fused attention)."""
    s, b, h, a, t = seq_len, micro_batch, cfg.n_embd, cfg.n_head, tp
    if recompute == "full":
        return 2 * s * b * h
    attn_core = 5 * a * s / h
    if recompute == "selective":
        attn_core = 0.0
    if sequence_parallel:
        return s * b * h * (34 + attn_core) / t
    return s * b * h * (10 + (24 + attn_core) / t)


# ----------------------------------------------------------------------------------------------
# prediction


@dataclass
class _Stage:
    layers: int
    has_embedding: bool
    has_head: bool
    in_flight: int  # micro-batches whose activations this stage holds at once


def _stages(cfg: GPTConfig, pp: int, schedule: str, microbatches: int) -> list[_Stage]:
    # imported here: the module imports torch.distributed.pipelining (and torch._dynamo), which planning
    # does not need (`trainlab lab --plan`, `gpt plan` stay light)
    from trainlab.gpt.parallel.pipeline import stage_layer_ranges

    out = []
    for s, layers in enumerate(stage_layer_ranges(cfg.n_layer, pp)):
        in_flight = microbatches if schedule == "gpipe" else min(pp - s, microbatches)
        out.append(_Stage(len(layers), s == 0, s == pp - 1, in_flight))
    return out


def attention_for(
    cfg: GPTConfig, strategy, device_type: str = "cuda", sm: int = 90, cudnn_version: int | None = None
) -> AttentionChoice:
    """The SDPA kernel a strategy's attention runs (autocast's dtype, or fp32)."""
    spec = _spec(strategy)
    dtype = {"bf16": "bf16", "fp16": "fp16"}.get(spec.amp, "fp32")
    return choose(cfg.head_width, dtype, device_type, sm, cudnn_version)


def predict_memory(
    cfg: GPTConfig,
    strategy="none",
    world_size: int = 1,
    micro_batch: int = 1,
    seq_len: int | None = None,
    tp: int = 1,
    pp: int = 1,
    *,
    microbatches: int | None = None,
    pp_schedule: str = "1f1b",
    accumulation_steps: int = 1,
    optimizer: str = "foreach",
    sequence_parallel: bool = False,
    device_type: str = "cuda",
    sm: int = 90,
    cudnn_version: int | None = None,
    attention: AttentionChoice | None = None,
    loss: str = "cross_entropy",
    cast_once: bool = False,
) -> dict:
    """Predicted per-device bytes for one training step (the worst pipeline stage).

    Returns params_bytes, grads_bytes, optimizer_bytes, activations_bytes, buffers_bytes,
    temporaries_bytes, total_bytes (predicted peak), sum_bytes, host_bytes (CPU offload), the
    per-phase peaks and the attention kernel assumed. `cast_once`: the blocks' 16-bit weight copies
    live for the whole step (`model.WeightCache`) instead of as each layer's saved activations. `optimizer`: "foreach" (one fp32 temporary the
    size of the parameters), "fused" (none) or "forloop" (the largest parameter). The attention
    kernel is the one PyTorch picks on `device_type` (GPU compute capability `sm` × 10, cuDNN version)
    unless `attention` names one (e.g. forced with torch.nn.attention.sdpa_kernel).
    """
    spec = _spec(strategy)
    if spec.data_parallel == "nvme":
        raise ConfigError("--strategy nvme: the planner does not model DeepSpeed ZeRO-Infinity's NVMe swapping")
    seq = seq_len or cfg.n_positions
    deg = resolve_degrees(spec, world_size, tp, pp)
    if cfg.n_head % deg.tp:
        raise ConfigError(f"--tp {deg.tp}: must divide the number of heads ({cfg.n_head})")
    if deg.pp > cfg.n_layer:
        raise ConfigError(f"--pp {deg.pp}: more pipeline stages than layers ({cfg.n_layer})")
    dp = deg.dp
    tokens = micro_batch * seq
    amp = spec.amp is not None
    p = 2 if amp else FP32
    r = 2 if amp and cfg.residual_16bit else FP32  # autocast keeps the residual stream in fp32 unless asked
    attn = attention or attention_for(cfg, spec, device_type, sm, cudnn_version)
    V, h = cfg.padded_vocab, cfg.n_embd  # the embedding's rows and the logits' width, padding included
    n_mb = microbatches or 1
    stages = _stages(cfg, deg.pp, pp_schedule, n_mb) if deg.pp > 1 else [_Stage(cfg.n_layer, True, True, 1)]

    best = None
    for st in stages:
        lp = layer_param_count(cfg, deg.tp)
        embed = (V * h + cfg.n_positions * h) if st.has_embedding else 0
        head = (2 * h + (0 if st.has_embedding else V * h)) if st.has_head else 0  # pp: last stage's own copy of wte
        P = st.layers * lp + embed + head  # parameters this rank computes with
        shard = dp if spec.uses_fsdp else 1
        root = embed + head  # FSDP2 root group: embeddings, ln_f (unsharded fwd→bwd)

        # --- persistent state
        params_dev = FP32 * P / shard
        host = 0.0
        opt_state = 2 * FP32 * P / (dp if spec.data_parallel in ("zero1", "zero2", "zero3") else 1)
        grads_full = FP32 * P / shard  # after backward (sharded under FSDP)
        buffers = FP32 * P if spec.data_parallel in ("ddp", "zero1") else 0.0  # DDP gradient buckets
        if spec.offload:  # sharded state lives in host memory
            host = params_dev + grads_full + opt_state
            params_dev, grads_full, opt_state = 0.0, 0.0, 0.0
        if spec.uses_fsdp:
            params_dev += FP32 * root  # root stays unsharded between forward and backward

        # --- activations (per micro-batch, times the micro-batches a pipeline stage holds)
        layer_act = (
            layer_activation_bytes_per_token(cfg, spec.ckpt, r, p, deg.tp, sequence_parallel, attn, seq) * tokens
        )
        layer_full = layer_activation_bytes_per_token(cfg, "none", r, p, deg.tp, sequence_parallel, attn, seq) * tokens
        weights16 = 2 * layer_linear_param_count(cfg, deg.tp)  # a layer's 16-bit weight copies (amp)
        cached = weights16 * st.layers if amp and cast_once else 0.0  # made once, held all step
        if amp and spec.ckpt != "full" and not cast_once:
            layer_act += weights16  # autocast's copies, saved for backward
        if amp and not cast_once:
            layer_full += weights16
        head_act = 0.0
        logits_tmp = 0.0
        if st.has_head and loss == "chunked":
            # gpt.loss: ln_f input, and the loss's stored gradients d(hidden) [N, h] (ln_f output dtype: the
            # residual's) and d(weight) in fp32; one chunk's logits (16-bit), fp32 softmax and 16-bit
            # gradient, and (amp) the 16-bit copy of the weight are the temporaries
            head_act = tokens * (r * h + r * h) + FP32 * V * h
            logits_tmp = min(tokens, CHUNK_TOKENS) * V * (FP32 + (2 * p if amp else 0)) + (p * V * h if amp else 0)
        elif st.has_head:
            head_act = tokens * (r * h + p * h + FP32 * V)  # ln_f input, lm_head input, log_softmax output
            logits_tmp = tokens * 2 * FP32 * V  # d(log_softmax out), d(logits) at backward start
            if amp:
                logits_tmp += tokens * 2 * V  # 16-bit gradient of the 16-bit logits
        acts = st.in_flight * (st.layers * layer_act + head_act)
        if deg.pp > 1 and not st.has_head:
            acts += st.in_flight * r * h * tokens  # the stage output kept for its backward

        # --- unsharded FSDP parameters during compute
        unsharded_fwd = 0.0
        if spec.uses_fsdp:
            prefetch = 2 * FP32 * lp  # the current and the prefetched block
            unsharded_fwd = FP32 * lp * st.layers if spec.data_parallel == "zero2" else prefetch
            if spec.data_parallel == "zero2" and spec.offload:
                unsharded_fwd = FP32 * lp * st.layers
        persistent_grads = grads_full if accumulation_steps > 1 else 0.0

        # A: start of backward (set_to_none=True: no gradients yet unless accumulating)
        static = params_dev + opt_state + buffers + persistent_grads + cached
        phase_a = static + acts + logits_tmp + unsharded_fwd
        # C: walk the backward through this stage's layers, last to first
        phase_c = 0.0
        for i in reversed(range(st.layers)):
            done = st.layers - 1 - i  # layers whose backward finished
            if spec.uses_fsdp or spec.offload:
                g = FP32 * (root + 2 * lp)  # unsharded grads of the head and the current block
                g += FP32 * (done * lp) / shard if not spec.offload else 0.0
                unsh = (FP32 * lp * (i + 1)) if spec.data_parallel == "zero2" else 2 * FP32 * lp
            else:
                g = FP32 * (root + (done + 1) * lp) if not persistent_grads else 0.0
                unsh = 0.0
            live = st.in_flight * (i + 1) * layer_act + (st.in_flight - 1) * head_act
            if spec.ckpt != "none":
                live += layer_full - (layer_act if spec.ckpt == "full" else 0)  # the recomputed layer
            bwd_tmp = tokens * (2 * 4 * p * h / deg.tp + 2 * r * h)  # d(GELU out), d(fc out), residual grads
            if attn.stores_scores:  # math path: d(probabilities) and d(scores) while the layer's attention
                # backward runs — after its MLP's backward, so instead of (not on top of) the MLP temporaries
                bwd_tmp = max(bwd_tmp, tokens * 2 * (cfg.n_head / deg.tp) * seq * p)
            phase_c = max(phase_c, static + g + live + unsh + bwd_tmp)
        # B: optimizer step
        grads_b = grads_full if not spec.offload else 0.0
        if optimizer == "fused" or spec.offload:
            opt_tmp = 0.0
        elif optimizer == "forloop" or spec.tp:
            opt_tmp = FP32 * max(V * h if (st.has_embedding or st.has_head) else 0, 4 * h * h // deg.tp)
        else:
            opt_tmp = FP32 * P / (dp if spec.data_parallel in ("zero1", "zero2", "zero3") else 1)
        phase_b = params_dev + opt_state + buffers + grads_b + opt_tmp + cached

        peak = max(phase_a, phase_b, phase_c)
        result = {
            "strategy": spec.text,
            "params_bytes": int(params_dev),
            "grads_bytes": int(grads_b if not spec.uses_fsdp else max(grads_b, FP32 * (root + 2 * lp))),
            "optimizer_bytes": int(opt_state),
            "activations_bytes": int(acts),
            "buffers_bytes": int(buffers + unsharded_fwd + cached),
            "temporaries_bytes": int(max(logits_tmp, opt_tmp)),
            "host_bytes": int(host),
            "phase_bytes": {
                "backward_start": int(phase_a),
                "backward_walk": int(phase_c),
                "optimizer_step": int(phase_b),
            },
            "total_bytes": int(peak),
            "params_on_device": int(P),
            "attention": {
                "backend": attn.backend,
                "label": attn.label if not cfg.head_dim_padded else f"{attn.label}, {cfg.attention_layout} layout",
                "layout": cfg.attention_layout,
                "head_dim": attn.head_dim,
                "padded_head_dim": attn.padded_head_dim,
                "stores_scores": attn.stores_scores,
                "why": attn.why,
            },
        }
        result["sum_bytes"] = int(
            sum(
                result[k]
                for k in (
                    "params_bytes",
                    "grads_bytes",
                    "optimizer_bytes",
                    "activations_bytes",
                    "buffers_bytes",
                    "temporaries_bytes",
                )
            )
        )
        if best is None or result["total_bytes"] > best["total_bytes"]:
            best = result
    best["degrees"] = {"dp": deg.dp, "tp": deg.tp, "pp": deg.pp}
    best["micro_batch"] = micro_batch
    best["seq_len"] = seq
    return best


def usable_bytes(gpu_mem: int) -> int:
    """Device memory a step may use: minus the CUDA context reserve and a fragmentation margin."""
    return int((gpu_mem - CONTEXT_RESERVE_BYTES) * (1 - FRAGMENTATION_MARGIN))


def default_strategies(gpus: int) -> list[str]:
    """Strategies worth planning for `gpus` devices (the handout's list alone and combined)."""
    single = [
        "none",
        "amp",
        "ckpt",
        "ckpt-selective",
        "amp+ckpt",
        "amp+ckpt-selective",
        "offload",
        "offload+amp",
        "offload+amp+ckpt",
    ]
    if gpus == 1:
        return single
    multi = [
        "ddp",
        "ddp+amp",
        "ddp+amp+ckpt",
        "zero1",
        "zero1+amp",
        "zero2",
        "zero2+amp",
        "zero2+amp+ckpt",
        "zero3",
        "zero3+amp",
        "zero3+amp+ckpt",
        "zero3+offload+amp",
        "pp",
        "pp+amp",
        "pp+amp+ckpt",
    ]
    if gpus % 2 == 0:
        multi += ["tp", "tp+amp", "tp+amp+ckpt"]
    if gpus >= 4 and gpus % 2 == 0:
        multi += ["tp+pp", "tp+pp+amp"]
    return multi + mesh_rows(gpus)  # data × model parallelism on one mesh (4+ GPUs)


def predict_plan(plan: GPTPlan) -> dict:
    """`predict_memory` for a resolved run: the one translation from a plan into the planner, used
    before a run (the out-of-memory check, `gpt plan`, compare's table) and in it (the summary)."""
    return predict_memory(
        plan.model,
        plan.strategy,
        plan.world_size,
        plan.micro_batch,
        plan.seq,
        plan.degrees.tp,
        plan.degrees.pp,
        microbatches=plan.micro_steps if plan.pipeline else None,
        pp_schedule=plan.pp_schedule,
        accumulation_steps=1 if plan.pipeline else plan.micro_steps,
        optimizer=plan.optimizer_kernel,
        attention=plan.attention,
        loss=plan.loss,
        cast_once=plan.cast_once,
    )


def predicted_peak(plan: GPTPlan) -> int | None:
    """The plan's predicted per-device peak, or None where the planner has no model of the run: the
    HF implementation (its activations differ), nvme (DeepSpeed swaps to NVMe). A compiled step is
    predicted as the eager one (inductor fuses and frees earlier: an upper bound)."""
    if plan.impl != "ours" or plan.strategy.data_parallel == "nvme":
        return None
    return predict_plan(plan)["total_bytes"]


# ----------------------------------------------------------------------------------------------
# time: a roofline estimate that ranks plans on one machine (--micro-batch-auto picks the fastest)

# Fitted to issue 35's H200 rows (GPT-2 1.6B, bf16, compile, global batch 16; `../shared/gpu/h200-2026-11-27`):
# the 16 × 1 step took 412 ms, of which attention 131.6 ms (the micro-table's head_dim-50 row) and fused
# AdamW 13 ms; the 8 × 2 step 445 ms. The rest, the 6N GEMMs with their glue, then runs at
# GEMM_EFFICIENCY · T / (T + GEMM_HALF_TOKENS) of the peak for T tokens per micro-step (0.58 at 16K tokens).
GEMM_EFFICIENCY = 0.65
GEMM_HALF_TOKENS = 2000
# Attention fwd + bwd, fraction of the peak by kernel (same micro-table, [16, 32, 1024, d] × 48 layers):
# head widths that are not a multiple of 8 (flash pads each call) 131.6 ms → 0.12; contiguous heads a
# multiple of 8 (cuDNN) 55.5 ms → 0.28. Not measured for other shapes or GPUs: an estimate there.
ATTENTION_EFFICIENCY = {"aligned": 0.28, "unaligned": 0.12}
# H100 SXM's dense bf16 peak and HBM bandwidth: the unit of the estimate (only ratios rank plans).
PEAK_FLOPS = 989e12
BANDWIDTH = 3.35e12
# fp32 matmuls against that peak (H100 SXM data sheet): TF32 tensor cores 494.7, plain fp32 66.9 TFLOP/s
FP32_FRACTION = {"tf32": 0.5, "fp32": 0.068}


def predicted_step_seconds(plan: GPTPlan, peak_flops: float = PEAK_FLOPS, bandwidth: float = BANDWIDTH) -> float:
    """Estimated seconds of one optimizer step of `plan` on one device (a roofline model, not a promise).

    GEMMs (hardware FLOPs: recomputation and padded heads included) at an efficiency that grows with the
    micro-step's tokens; attention at the efficiency of its layout; per micro-step beyond the first, the
    weights' 16-bit recast (6 bytes a parameter, amp; none with cast_once) and the gradient accumulation
    (8 bytes); AdamW's pass
    over weights, gradients and m, v (28 bytes a parameter). Data-parallel ranks each run their slice."""
    from trainlab.gpt.flops import attention_flops_per_token, hardware_flops_per_token

    cfg, seq = plan.model, plan.seq
    tokens = plan.per_rank_batch * seq / max(1, plan.degrees.tp * plan.degrees.pp)
    micro_tokens = plan.micro_batch * seq
    attn = attention_flops_per_token(cfg, seq) * cfg.n_head * cfg.head_width / cfg.n_embd
    gemm = hardware_flops_per_token(cfg, seq, plan.checkpointing) - attn
    gemm_eff = GEMM_EFFICIENCY * micro_tokens / (micro_tokens + GEMM_HALF_TOKENS)
    aligned = plan.attention.head_dim % 8 == 0 and plan.attention.backend in ("cudnn", "flash", "efficient")
    attn_eff = ATTENTION_EFFICIENCY["aligned" if aligned else "unaligned"]
    n = count_params(cfg)
    extra_steps = max(0, plan.micro_steps - 1) if not plan.pipeline else 0
    per_micro = (6 if plan.amp and not plan.cast_once else 0) + 8
    if not plan.amp:
        peak_flops *= FP32_FRACTION["fp32" if plan.tf32 == "off" else "tf32"]
    seconds = tokens * (gemm / gemm_eff + attn / attn_eff) / peak_flops
    return seconds + (extra_steps * per_micro * n + 28 * n) / bandwidth


# strategy, micro-batch → the plan of that run on the planned machine (`PlanConfig.resolver`)
Resolver = Callable[[str, int], GPTPlan]


def largest_micro_batch(resolver: Resolver, strategy: str, budget: int, limit: int = 4096) -> int:
    """Largest micro-batch whose predicted peak fits `budget` bytes (0 if even 1 does not)."""

    def fits(b):
        try:
            return predict_plan(resolver(strategy, b))["total_bytes"] <= budget
        except ConfigError:  # e.g. a micro-batch the pipeline cannot split
            return False

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def plan(
    resolver: Resolver,
    gpus: int,
    gpu_mem: int,
    micro_batch: int = 1,
    strategies: list[str] | None = None,
    model_name: str = "",
) -> dict:
    """Predictions for every strategy on `gpus` devices of `gpu_mem` bytes each; `resolver` turns a
    strategy and a micro-batch into the run's plan on that machine (its device, compute capability
    and optimizer kernel decide the attention kernel and the temporaries)."""
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: expected >= 1")
    if micro_batch < 1:
        raise ConfigError(f"--micro-batch {micro_batch}: expected >= 1")
    resolver("none", micro_batch)  # a flag wrong for every strategy (--seq, --model) is one error, not one per row
    budget = usable_bytes(gpu_mem)
    rows, first = [], None
    for name in strategies or default_strategies(gpus):
        spec = _spec(name)
        if spec.distributed and gpus == 1 and (spec.tp or spec.pp or spec.data_parallel in ("ddp", "zero1")):
            continue  # nothing to split on one device
        try:
            p = resolver(name, micro_batch)
            if predicted_peak(p) is None:
                raise ConfigError(f"--strategy {spec.text}: the planner does not model it (nvme, or --impl hf)")
        except (ConfigError, HardwareError) as e:
            rows.append({"strategy": spec.text, "error": str(e), "fits": False, "total_bytes": None})
            continue
        first = first or p
        pred = predict_plan(p)
        pred["fits"] = pred["total_bytes"] <= budget
        pred["predicted_step_ms"] = p.predicted_step_ms
        pred["loss"] = p.loss
        pred["max_micro_batch"] = largest_micro_batch(resolver, name, budget)
        rows.append(pred)
    return {
        "model": model_name,
        "params": count_params(first.model) if first else None,
        "gpus": gpus,
        "gpu_mem_bytes": gpu_mem,
        "usable_bytes": budget,
        "micro_batch": micro_batch,
        "seq_len": first.seq if first else None,
        "sm": first.sm if first else None,
        "assumptions": {
            "master_weights": "fp32 (autocast for amp)",
            "optimizer": f"AdamW fp32 m and v, {first.optimizer_kernel if first else '-'} step",
            "fragmentation_margin": FRAGMENTATION_MARGIN,
            "context_reserve_bytes": CONTEXT_RESERVE_BYTES,
            "activations": "Korthikanti et al. 2022 bookkeeping, no dropout, with the SDPA kernel PyTorch picks "
            "per dtype and head width (see each row's attention)",
        },
        "strategies": rows,
    }


def format_plan(result: dict) -> str:
    """A fixed-width table of `plan()`'s result."""

    def g(x):
        return "-" if x is None else f"{x / GiB:7.2f}"

    lines = [
        f"model {result['model']}  params {result['params']:,}  gpus {result['gpus']}  "
        f"memory {result['gpu_mem_bytes'] / GiB:.1f} GiB (usable {result['usable_bytes'] / GiB:.1f} GiB)  "
        f"micro-batch {result['micro_batch']}  seq {result['seq_len']}  sm{result.get('sm', 90)}",
        f"{'strategy':<22}{'params':>8}{'grads':>8}{'optim':>8}{'activ':>8}{'other':>8}{'PEAK GiB':>9}"
        f"{'host':>8}  fits  max-micro-batch  step ms*  loss           attention (SDPA kernel)",
    ]
    for r in result["strategies"]:
        if r.get("error"):
            lines.append(f"{r['strategy']:<22}  error: {r['error']}")
            continue
        other = r["buffers_bytes"] + r["temporaries_bytes"]
        lines.append(
            f"{r['strategy']:<22}{g(r['params_bytes'])} {g(r['grads_bytes'])}{g(r['optimizer_bytes'])} "
            f"{g(r['activations_bytes'])}{g(other)} {g(r['total_bytes'])}{g(r['host_bytes'])}  "
            f"{'yes ' if r['fits'] else 'NO  '}  {r['max_micro_batch']:<15d}  "
            f"{r.get('predicted_step_ms') or 0:8.0f}  {r.get('loss', '-'):<13}  {r['attention']['label']}"
        )
    why = {r["attention"]["label"]: r["attention"]["why"] for r in result["strategies"] if not r.get("error")}
    lines += [f"  {label}: {reason}" for label, reason in why.items()]
    lines.append(
        "  * step ms: the planner's roofline estimate for this micro-batch on an H100 (planner.predicted_step_seconds)"
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# measurement, to validate the prediction where torch.cuda's peak counters do not exist (CPU)


def _live_bytes_mode():
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        """Peak bytes of live tensor storages, seen at every ATen op (any device).

        Storages are keyed by address and held by weak reference, so a freed tensor stops counting
        as soon as it dies, like the caching allocator's `allocated` counter without its rounding.
        Tensors that exist before the mode (weights, optimizer states) are passed in `tensors`.
        """

        def __init__(self, tensors=()):
            super().__init__()
            self.live: dict[int, tuple] = {}
            self.peak = 0
            for t in tensors:
                self._add(t)
            self.peak = self.current()

        def _add(self, t):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                return
            t = getattr(t, "_local_tensor", t)  # DTensor (FSDP2 / TP): its local shard holds the bytes
            try:
                st = t.untyped_storage()
                key = st.data_ptr()
            except (RuntimeError, NotImplementedError):  # tensor subclasses / functional collectives
                return  # without a real storage
            old = self.live.get(key)
            if old is not None and old[0]() is not None:
                return
            self.live[key] = (weakref.ref(st), st.nbytes())

        def current(self) -> int:
            for k in [k for k, (ref, _) in self.live.items() if ref() is None]:
                del self.live[k]
            return sum(n for _, n in self.live.values())

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                self._add(t)
            self.peak = max(self.peak, self.current())
            return out

    return LiveBytes


def measure_step_peak_bytes(engine, tokens, warm: bool = False) -> int:
    """Peak live tensor bytes (this rank) of one `engine.train_step(tokens)`.

    Runs a first untracked step unless `warm` (the optimizer states must exist). Exact on CPU (no
    allocator rounding, no CUDA context); inside DTensor ops only their outputs are seen."""
    import torch

    if not warm:
        engine.train_step(tokens)  # creates the optimizer states
    opt = engine.optimizer
    opt = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps the local optimizer here
    opt_states = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    tensors = list(engine.model.parameters()) + list(engine.model.buffers()) + opt_states
    with _live_bytes_mode()(tensors) as tracker:
        engine.train_step(tokens)
    return tracker.peak


# ----------------------------------------------------------------------------- before a run builds anything


def out_of_memory_line(need: int | None, free: int | None, where: str) -> str:
    """The one line for a run that does not fit: "out of memory: needs ≈X, has Y; see `trainlab gpt plan`"."""
    needs = f"needs ≈{need / 2**30:.1f} GiB" if need is not None else "needs more"
    has = f"has {free / 2**30:.1f} GiB free" if free is not None else "has less"
    return f"out of memory: {needs}, {has} ({where}); see `trainlab gpt plan`"


def memory_shortfall(plan: GPTPlan) -> str | None:
    """`out_of_memory_line` when the plan's predicted peak exceeds the free memory of its device(s),
    checked before anything is built or launched; None when it fits or cannot be predicted. CPU ranks
    share the host's memory; each GPU rank has its own device."""
    import torch

    from trainlab.device import free_memory

    need = plan.predicted_peak_bytes
    if need is None:
        return None
    cpu = plan.device == "cpu"
    ranks = plan.world_size if cpu else 1
    devices = [torch.device("cpu")] if cpu else [torch.device("cuda", i) for i in range(plan.world_size)]
    for d in devices:
        free = free_memory(d)
        if free is not None and need * ranks > free:
            where = (
                f"{ranks} CPU ranks × {need / 2**30:.1f} GiB in host memory" if ranks > 1 else f"{d}, planner estimate"
            )
            return out_of_memory_line(need * ranks, free, where)
    return None
