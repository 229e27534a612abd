"""A GPT-2 model's shape: its config (sizes and the implementation's levers), the presets, the parameter
count, and the chunked loss's rows per chunk. Plain data and arithmetic, no torch: flags, `gpt plan` and
the memory planner read them without importing the model (`trainlab gpt --help` stays instant)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainlab.errors import ConfigError

# the chunked loss's rows per chunk (gpt.loss): the planner sizes its logits buffer from it
CHUNK_TOKENS = 4096


@dataclass
class GPTConfig:
    vocab_size: int = 50257  # GPT-2 BPE vocabulary
    n_positions: int = 1024  # maximum sequence length (learned position embeddings)
    n_embd: int = 768  # hidden size C
    n_layer: int = 12  # number of transformer blocks L
    n_head: int = 12  # attention heads; head_dim = n_embd // n_head
    layer_norm_epsilon: float = 1e-5
    # Levers of the implementation, not of the function (issue 30): the model computes the same loss
    # and gradients with any of them (tests/test_gpt_levers.py).
    vocab_multiple: int = 1  # embedding/LM-head rows padded to a multiple (64: 50257 → 50304)
    fused_qkv: bool = False  # q, k, v as one [3C, C] Linear: one GEMM instead of three
    # 0: heads stored head_dim wide ("plain"); else each head stored this wide (≥ head_dim), the extra
    # columns zero (issue 35's padded layout: SDPA gets heads it can hand to cuDNN, see CausalSelfAttention)
    head_dim_padded: int = 0
    # issue 35's glue: under autocast, the residual stream in its 16-bit dtype (LayerNorm statistics
    # still fp32, see LayerNorm); 16-bit math, so not the same function: proved against fp32 within bf16
    residual_16bit: bool = False
    # each block returns (h, next LayerNorm(h)) from one function (`add_layer_norm`): the last residual
    # add and the next block's ln_1 (ln_f after the last block) in one compiled graph, so inductor fuses them
    fused_boundary: bool = False

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def head_width(self) -> int:
        """The width each head is stored and computed at: head_dim, or the padded layout's."""
        return self.head_dim_padded or self.head_dim

    @property
    def attention_layout(self) -> str:
        """plain | padN: the plan's name of the head layout (`gpt plan`, logs)."""
        return f"pad{self.head_dim_padded}" if self.head_dim_padded else "plain"

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding and the LM head: the vocabulary rounded up to `vocab_multiple`. The
        50257-wide head runs misaligned GEMMs (cutlass align1 kernels, ~13 % of the H100 step)."""
        m = max(1, self.vocab_multiple)
        return -(-self.vocab_size // m) * m


PRESETS: dict[str, GPTConfig] = {
    # the handout's bonus model: 1,557,611,200 parameters
    "gpt2-1.6b": GPTConfig(n_embd=1600, n_layer=48, n_head=32),
    "gpt2": GPTConfig(n_embd=768, n_layer=12, n_head=12),
    "gpt2-medium": GPTConfig(n_embd=1024, n_layer=24, n_head=16),
    "gpt2-large": GPTConfig(n_embd=1280, n_layer=36, n_head=20),
    "gpt2-xl": GPTConfig(n_embd=1600, n_layer=48, n_head=25),
    # CPU-test sizes: small enough for 2 cores, heads divisible by 2 and 4 for tensor parallel
    "tiny": GPTConfig(vocab_size=512, n_positions=64, n_embd=64, n_layer=4, n_head=4),
    "tiny-8l": GPTConfig(vocab_size=512, n_positions=64, n_embd=64, n_layer=8, n_head=4),
}


def get_preset(name: str) -> GPTConfig:
    """The preset's config (a copy). Unknown names are a ConfigError listing the valid ones."""
    if name not in PRESETS:
        raise ConfigError(f"--model {name!r}: unknown preset; expected one of {', '.join(PRESETS)}")
    return replace(PRESETS[name])


def count_params(cfg: GPTConfig) -> int:
    """Parameter count from the config alone (tied embedding counted once)."""
    C, L, V, T = cfg.n_embd, cfg.n_layer, cfg.vocab_size, cfg.n_positions
    embeddings = V * C + T * C
    block = 2 * 2 * C + 4 * (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)  # 2 LN, q/k/v/o, fc, proj
    return embeddings + L * block + 2 * C  # + ln_f
