"""FLOPs per token and TFLOPS of a GPT-2 training step, by the two formulas the issue asks for.

1. The handout's `get_tflops`: params · batch · seq · 8. The 8 = 2 (forward) + 4 (backward) + 2
   (forward again, for activation recomputation) FLOPs per parameter and token; it ignores the
   attention's s×s matmuls and assumes recomputation even when none happens. Its `params` is the
   handout's `get_model_size`, which sums `module.parameters(recurse=False)` over every module: the
   tied embedding (`wte.weight` is also `lm_head.weight`) is counted twice, 1,638,022,400 for the
   1.6B model instead of its 1,557,611,200 distinct parameters. The "handout" TFLOPS we report use
   the handout's number, as the handout's code computes it; "8N" uses the distinct count.
2. PaLM / nanoGPT: 6·N per token for the parameter matmuls (forward 2N, backward 4N) plus the
   attention scores and the weighted sum, 12·L·C·T per token (QKᵀ and A·V, 2·T·C each, forward and
   backward: ×3). With full activation checkpointing the forward runs twice: +2N (+4·L·C·T)
   — that is *hardware* FLOPs; MFU uses the model FLOPs without recomputation.

N counts every parameter once (the tied LM head is a real V×C matmul, which the embedding lookup
it shares weights with is not; the position embedding adds a negligible T×C).
"""

from __future__ import annotations

from trainlab.gpt.shape import GPTConfig, count_params


def attention_flops_per_token(cfg: GPTConfig, seq_len: int) -> float:
    """12·L·C·T: the attention's QKᵀ and A·V matmuls, forward + backward, per token."""
    return 12.0 * cfg.n_layer * cfg.n_embd * seq_len


def flops_per_token(cfg: GPTConfig, seq_len: int, checkpointing: bool = False) -> float:
    """6N + 12·L·C·T model FLOPs per trained token; + 2N with recomputation (as the issue spells it)."""
    n = count_params(cfg)
    flops = 6.0 * n + attention_flops_per_token(cfg, seq_len)
    if checkpointing:
        flops += 2.0 * n
    return flops


def hardware_flops_per_token(cfg: GPTConfig, seq_len: int, ckpt: str = "none") -> float:
    """FLOPs the device actually executes per token, recomputation included.

    "full" recomputes each block's forward (2N of the blocks + the attention's forward 4·L·C·T);
    "selective" (our MLP recompute) redoes fc and proj: 2 · 8·C² per layer per token. The padded head
    layout (`head_dim_padded`) multiplies zero columns too: q/k/v/o are C×(heads·width) GEMMs and the
    attention's matmuls run at the padded width (MFU keeps the model FLOPs, `flops_per_token`).
    """
    base = flops_per_token(cfg, seq_len, checkpointing=False)
    wide = cfg.n_head * cfg.head_width
    if wide != cfg.n_embd:
        base += 6.0 * cfg.n_layer * 4 * cfg.n_embd * (wide - cfg.n_embd)
        base += attention_flops_per_token(cfg, seq_len) * (wide / cfg.n_embd - 1)
    if ckpt == "full":
        return base + 2.0 * count_params(cfg) + attention_flops_per_token(cfg, seq_len) / 3.0
    if ckpt == "selective":
        return base + 16.0 * cfg.n_layer * cfg.n_embd**2
    return base


def handout_model_size(model) -> int:
    """The handout's `get_model_size(model)`, literally: per module, its own parameters (a parameter
    shared by two modules — the tied embedding — is counted once for each)."""
    total = 0
    for module in model.modules():
        for p in module.parameters(recurse=False):
            total += p.numel()
    return total


def handout_param_count(cfg: GPTConfig) -> int:
    """What `handout_model_size` returns for a GPT-2 of this config (ours or HF's): the distinct
    parameters plus the tied V×C embedding a second time (as `lm_head.weight`)."""
    return count_params(cfg) + cfg.vocab_size * cfg.n_embd


def handout_tflops(params: int, batch: int, seq: int, step_s: float) -> float:
    """The handout's `get_tflops(model_numel, batch_size, seq_len, step_time)`."""
    return params * batch * seq * 8 / 1e12 / (step_s + 1e-12)


def tflops(flops_per_tok: float, tokens_per_s: float) -> float:
    return flops_per_tok * tokens_per_s / 1e12


def mfu(tflops_per_device: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilization, a fraction of the device's peak (None when the peak is unknown)."""
    if not peak_tflops:
        return None
    return tflops_per_device / peak_tflops
