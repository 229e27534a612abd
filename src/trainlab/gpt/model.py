"""GPT-2 built from `nn.Linear` layers, with a state-dict mapping to and from HF `GPT2LMHeadModel`.

Why our own model and not HF's: HF's `Conv1D` stores weights transposed and cannot be split by
DTensor tensor parallel, and a pipeline stage needs to delete blocks while keeping parameter names
(`h` is a `ModuleDict` keyed "0".."L-1" for that reason). The math is GPT-2's exactly: pre-LayerNorm
blocks, causal scaled-dot-product attention, GELU tanh approximation ("gelu_new"), tied input and
output embeddings, no dropout (training on random tokens; dropout would make strategies differ).

`--impl hf` runs HF's model itself (`build_hf_model`), the handout's baseline.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trainlab.distributed.wrappers import unwrap
from trainlab.errors import ConfigError
from trainlab.gpt.loss import IGNORE, shifted_targets
from trainlab.gpt.shape import GPTConfig


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose statistics are fp32 whatever its input's dtype, its output in the input's dtype.
    On fp32 input (the plain residual) it is nn.LayerNorm itself. On a 16-bit residual (`residual_16bit`)
    it normalizes in fp32 outside autocast: CUDA's autocast would do so too but return fp32, the CPU's
    runs layer_norm in bf16; the 16-bit output is the one rounding the next GEMM's autocast cast made."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.float(), self.normalized_shape, self.weight, self.bias, self.eps).to(x.dtype)


def add_layer_norm(x: torch.Tensor, y: torch.Tensor, ln: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The block boundary as one function: the residual add and the LayerNorm that reads it. Inside one
    compiled block inductor makes it one kernel (reads x and y, writes h and ln(h)); apart, the add ends
    one block's graph and the LayerNorm starts the next one's, which reads h back."""
    h = x + y
    return h, ln(h)


class CausalSelfAttention(nn.Module):
    """Causal self-attention. With `cfg.head_dim_padded` (the padded layout), q/k/v are projected
    straight into heads `head_width` wide whose extra columns are zero (zero rows of the projection
    weight and bias), and the output projection reads them (zero columns of its weight). Exact: zero
    q/k columns add nothing to QKᵀ, zero v columns give zero output columns, the scale is the real
    head_dim's, and every pad gradient is exactly zero (dq_pad = dS·k_pad = 0, dk_pad = dSᵀ·q_pad = 0,
    dv_pad = Pᵀ·dy_pad with dy_pad = d(out)·W_o[:, pad] = 0; W_o[:, pad] gets d(out)ᵀ·y_pad = 0), so
    AdamW (decay included) keeps the pads zero. Checkpoints and the HF mapping hold the unpadded
    weights (`pad_heads_state_dict` / `strip_heads_state_dict`)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        C, A = cfg.n_embd, cfg.n_head * cfg.head_width
        self.head_dim, self.head_width = cfg.head_dim, cfg.head_width
        # None: SDPA's default 1/sqrt(width) is the real one; padded: the real head_dim's, not the width's
        self.scale = None if cfg.head_width == cfg.head_dim else 1.0 / math.sqrt(cfg.head_dim)
        if cfg.fused_qkv:  # rows q | k | v, as HF's c_attn columns
            self.qkv_proj = nn.Linear(C, 3 * A, bias=True)
        else:  # three Linears: what tensor parallel splits column-wise, each on its own
            self.q_proj = nn.Linear(C, A, bias=True)
            self.k_proj = nn.Linear(C, A, bias=True)
            self.v_proj = nn.Linear(C, A, bias=True)
        self.o_proj = nn.Linear(A, C, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):
            # cast once: autocast would otherwise make (and save for backward) one 16-bit copy of
            # the LayerNorm output for each of q, k and v
            x = x.to(torch.get_autocast_dtype(x.device.type))
        if hasattr(self, "qkv_proj"):
            q, k, v = self.qkv_proj(x).chunk(3, dim=-1)  # views of one GEMM's output
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        B, T = q.shape[0], q.shape[1]
        # heads from the *local* width: under tensor parallel q holds only this rank's heads
        n_head = q.shape[-1] // self.head_width
        q, k, v = (t.view(B, T, n_head, self.head_width).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        y = y.transpose(1, 2).reshape(B, T, n_head * self.head_width)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=True)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))  # HF "gelu_new"


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)
        # "selective" recomputation of the MLP sub-block (see set_activation_checkpointing)
        self.recompute_mlp = False

    def _mlp_branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_2(x))

    def forward(self, x: torch.Tensor, normed: torch.Tensor | None = None, next_ln: nn.Module | None = None):
        """x → x + attn + mlp; with `next_ln` (the fused boundary) → (that, next_ln(that)), where `normed`
        is this block's ln_1(x) as the previous block computed it."""
        x = x + self.attn(self.ln_1(x) if normed is None else normed)
        if self.recompute_mlp and torch.is_grad_enabled():
            y = checkpoint(self._mlp_branch, x, use_reentrant=False)
        else:
            y = self._mlp_branch(x)
        return x + y if next_ln is None else add_layer_norm(x, y, next_ln)


CHECKPOINT_MODES = ("none", "full", "selective")


class GPT(nn.Module):
    """GPT-2 language model. `forward(tokens[B,T]) -> logits[B,T,V]`.

    Pipeline stages delete parts (set `wte`/`wpe`/`ln_f`/`lm_head` to None, `del model.h[key]`):
    without `wte` the input is the hidden state [B,T,C]; without `lm_head` the output is too.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        V = cfg.padded_vocab
        self.wte: nn.Embedding | None = nn.Embedding(V, cfg.n_embd)
        self.wpe: nn.Embedding | None = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layer)})
        self.ln_f: nn.LayerNorm | None = LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.lm_head: nn.Linear | None = nn.Linear(cfg.n_embd, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        if V != cfg.vocab_size:
            # The pad logits must never win the softmax: -inf through the GEMM's bias (fused into its
            # epilogue, no extra pass over the [B, T, V] logits) makes their probability exactly 0, so
            # loss and gradients are the unpadded model's and the pad rows get zero gradient.
            self.register_buffer("logit_mask", pad_logit_mask(cfg), persistent=False)
        self.activation_checkpointing = "none"
        self.weight_cache = None  # the blocks' 16-bit weights, made once per optimizer step (cast_weights_once)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The LM head on the final hidden states [.., C] → logits [.., padded_vocab] (pad columns -inf)."""
        return F.linear(x, self.lm_head.weight, getattr(self, "logit_mask", None))

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None, hidden_loss=None) -> torch.Tensor:
        """Logits [B, T, padded_vocab]; with `hidden_loss`, the loss `hidden_loss(hidden, head weight,
        mask, targets)` instead, so a chunked loss sees the hidden states and the [B, T, V] logits never
        exist whole (it runs inside forward, so DDP's hooks see it as the model's)."""
        if self.wte is not None:
            T = x.shape[1]
            if T > self.config.n_positions:
                raise ConfigError(f"--seq {T}: longer than the model's n_positions {self.config.n_positions}")
            pos = torch.arange(T, device=x.device)
            x = self.wte(x) + self.wpe(pos)
        dev = x.device.type
        if self.config.residual_16bit and torch.is_autocast_enabled(dev):
            x = x.to(torch.get_autocast_dtype(dev))  # every residual add after this one stays 16-bit
        if self.weight_cache is not None:
            self.weight_cache.refresh_if_stale()
        full = self.activation_checkpointing == "full" and torch.is_grad_enabled()
        blocks = list(self.h.values())
        fused = self.config.fused_boundary
        normed = None
        for i, block in enumerate(blocks):
            # the fused boundary: the next LayerNorm is computed by this block (ln_f's by the last one)
            nxt = (blocks[i + 1].ln_1 if i + 1 < len(blocks) else self.ln_f) if fused else None
            # use_reentrant=False: works with FSDP2 hooks, torch.compile and inputs without grad
            out = checkpoint(block, x, normed, nxt, use_reentrant=False) if full else block(x, normed, nxt)
            x, normed = out if nxt is not None else (out, None)
        if self.ln_f is not None:
            x = self.ln_f(x) if normed is None else normed
        if self.lm_head is not None:
            if hidden_loss is not None:
                return hidden_loss(x, self.lm_head.weight, getattr(self, "logit_mask", None), targets)
            x = self.logits(x)
        return x


def pad_logit_mask(cfg: GPTConfig, device=None) -> torch.Tensor:
    """[padded_vocab] fp32: 0 for real tokens, -inf for the padding columns."""
    mask = torch.zeros(cfg.padded_vocab, device=device)
    mask[cfg.vocab_size :] = float("-inf")
    return mask


def set_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """Recompute activations in the backward pass instead of storing them.

    "full": every block is a `torch.utils.checkpoint` region; only block inputs are kept (2·s·b·h
      bytes per layer in 16-bit, Korthikanti et al.).
    "selective": only the MLP sub-block (ln_2 → fc → GELU → proj) is recomputed. Korthikanti's
      selective recompute targets the attention core (softmax/dropout, the 5as/h term), but with
      `scaled_dot_product_attention` (flash / memory-efficient kernels) that core already stores
      only O(s·h); the MLP's 4h-wide pre-activation and GELU output are then the largest stored
      tensors; the price is recomputing fc and proj, 16·s·h² of the block's 24·s·h² matmul FLOPs.
    "none": store everything.
    """
    if mode not in CHECKPOINT_MODES:
        raise ConfigError(f"activation checkpointing {mode!r}: expected one of {', '.join(CHECKPOINT_MODES)}")
    gpt = _find_gpt(model)
    gpt.activation_checkpointing = mode
    for block in gpt.h.values():
        unwrap(block).recompute_mlp = mode == "selective"


def float8_block_linears(model: nn.Module) -> int:
    """Swap every Linear of the transformer blocks for torchao's Float8Linear (dynamic tensor-wise scaling:
    inputs and weights cast to e4m3, output gradients to e5m2, GEMMs by torch._scaled_mm; the master weights
    stay fp32). The embeddings, the tied LM head and the loss stay in bf16. torchao needs both GEMM dims
    to be multiples of 16 (every block Linear of GPT-2's presets is). Returns how many were swapped."""
    from torchao.float8 import convert_to_float8_training

    def wanted(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0

    swapped = 0
    for block in transformer_blocks(model):
        before = sum(isinstance(m, nn.Linear) for m in block.modules())
        convert_to_float8_training(block, module_filter_fn=wanted)
        swapped += before - sum(type(m) is nn.Linear for m in block.modules())
    return swapped


class _Use16(torch.autograd.Function):
    """The cached 16-bit copy stands in for the fp32 weight: forward is the copy, backward hands the
    16-bit gradient to the fp32 weight cast to its dtype, as autocast's own cast (ToCopyBackward) does."""

    @staticmethod
    def forward(ctx, master, copy):
        ctx.dtype = master.dtype
        return copy.view_as(copy)  # no copy; an in-place refresh before backward is autograd's error

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None


class CastOnceLinear(nn.Linear):
    """nn.Linear that, under autocast of its copies' dtype, computes with `weight16`/`bias16` (made by
    `WeightCache`) instead of casting the fp32 weight at every call: the same rounding, the same GEMM."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dev, w16 = x.device.type, self.weight16
        if not (torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) == w16.dtype):
            return super().forward(x)
        return F.linear(x.to(w16.dtype), _Use16.apply(self.weight, w16), _Use16.apply(self.bias, self.bias16))


class WeightCache:
    """16-bit copies of the blocks' Linear weights, made once per optimizer step and read by every
    micro-step. Under autocast each micro-step otherwise casts every fp32 weight again (autocast's
    cache ends with its context, one per micro-step; compiled blocks cast inside their graph): k
    micro-steps read 4 and write 2 bytes per parameter k times, this once. The copies are made again
    at the first forward after an optimizer step (`watch`: fused AdamW's kernel bumps no version
    counter) or any other in-place write to a weight (load_state_dict: its version counter moves),
    checked at each forward, outside the compiled blocks."""

    def __init__(self, linears: list[nn.Linear], dtype: torch.dtype):
        self.masters, self.copies = [], []
        for m in linears:
            m.__class__ = CastOnceLinear
            # plain attributes, not buffers: DDP would broadcast buffers at every forward
            m.weight16 = torch.empty_like(m.weight, dtype=dtype)
            m.bias16 = torch.empty_like(m.bias, dtype=dtype)
            self.masters += [m.weight, m.bias]
            self.copies += [m.weight16, m.bias16]
        self.versions: list[int] | None = None

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.register_step_post_hook(lambda *_: setattr(self, "versions", None))

    def refresh_if_stale(self) -> None:
        versions = [p._version for p in self.masters]
        if versions != self.versions:
            with torch.no_grad():
                torch._foreach_copy_(self.copies, self.masters)
            self.versions = versions


def cast_weights_once(model: nn.Module, dtype: torch.dtype) -> int:
    """Give every Linear of the transformer blocks a 16-bit copy (`WeightCache`) refreshed once per
    optimizer step; the embeddings and the tied LM head stay autocast's. Returns how many Linears."""
    gpt = _find_gpt(model)
    linears = [m for block in gpt.h.values() for m in block.modules() if type(m) is nn.Linear]
    gpt.weight_cache = WeightCache(linears, dtype)
    return len(linears)


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The per-layer blocks of our GPT (`model.h`) or HF's GPT2LMHeadModel (`model.transformer.h`)."""
    if hasattr(model, "h") and isinstance(model.h, nn.ModuleDict):
        return list(model.h.values())
    if hasattr(model, "transformer") and hasattr(model.transformer, "h"):
        return list(model.transformer.h)
    raise TypeError(f"{type(model).__name__}: cannot find the transformer blocks to shard")


def _find_gpt(model: nn.Module) -> GPT:
    for m in model.modules():
        if isinstance(m, GPT):
            return m
    raise TypeError("set_activation_checkpointing: no trainlab GPT inside this module")


# ----------------------------------------------------------------------------------------------
# deterministic initialization


def _canonical_param_names(cfg: GPTConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter of the full model, in a fixed order."""
    C, V, T = cfg.n_embd, cfg.vocab_size, cfg.n_positions
    names = [("wte.weight", (V, C)), ("wpe.weight", (T, C))]
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        names += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,))]
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names += [(p + f"attn.{proj}.weight", (C, C)), (p + f"attn.{proj}.bias", (C,))]
        names += [(p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,))]
        names += [(p + "mlp.fc.weight", (4 * C, C)), (p + "mlp.fc.bias", (4 * C,))]
        names += [(p + "mlp.proj.weight", (C, 4 * C)), (p + "mlp.proj.bias", (C,))]
    names += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return names


def initial_value(cfg: GPTConfig, name: str, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The initial fp32 value of parameter `name` (our FQN) for `seed`, drawn on `device`.

    Each parameter draws from its own generator seeded by (seed, name), so a pipeline stage that
    holds only some blocks, a tensor-parallel shard and the full model all see the same numbers.
    The levers change only the layout: a fused `attn.qkv_proj` is q, k and v's values stacked, a
    padded `wte` is the real rows followed by zeros (a pad row is never looked up, and its logit is
    masked), so every lever starts from the same numbers as the plain model.
    The draw happens on the device the model lives on: the CPU's single-threaded normal fill takes
    ~60 s for 1.6B parameters, a GPU's well under a second (issue 18). Same device type, same numbers;
    a CUDA stream of the same seed differs from the CPU's (different generators), so every model that
    is compared (strategies, ours and HF) is initialised on the one device it runs on.
    """
    shapes = dict(_canonical_param_names(cfg))
    if name == "lm_head.weight":  # tied to the input embedding
        name = "wte.weight"
    if cfg.head_dim_padded and _head_axis(name) is not None:  # the padded layout: the plain value, zero-padded
        plain = initial_value(replace(cfg, head_dim_padded=0), name, seed, device)
        return pad_heads(plain, cfg, _head_axis(name))
    if ".attn.qkv_proj." in name:
        return torch.cat(
            [
                initial_value(cfg, name.replace("qkv_proj", part), seed, device)
                for part in ("q_proj", "k_proj", "v_proj")
            ]
        )
    if name == "wte.weight" and cfg.padded_vocab != cfg.vocab_size:
        real = initial_value(replace(cfg, vocab_multiple=1), name, seed, device)
        return torch.cat([real, real.new_zeros(cfg.padded_vocab - cfg.vocab_size, cfg.n_embd)])
    if name not in shapes:
        raise KeyError(f"{name!r} is not a parameter of GPT")
    shape = shapes[name]
    leaf = name.rsplit(".", 1)[-1]
    if ".ln_" in name or name.startswith("ln_f."):
        return torch.ones(shape, device=device) if leaf == "weight" else torch.zeros(shape, device=device)
    if leaf == "bias":
        return torch.zeros(shape, device=device)
    std = 0.02
    if name.endswith("attn.o_proj.weight") or name.endswith("mlp.proj.weight"):
        std = 0.02 / math.sqrt(2 * cfg.n_layer)  # GPT-2's scaled init of residual projections
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.empty(shape, device=device).normal_(0.0, std, generator=gen)


@torch.no_grad()
def init_gpt_weights(model: nn.Module, seed: int) -> nn.Module:
    """GPT-2 init, identical for every strategy with the same seed (see `initial_value`).

    Must be called on a materialized (non-meta), not yet sharded model; each value is drawn on its
    parameter's device (see `initial_value`) and cast to its dtype.
    """
    gpt = _find_gpt(model)
    prefix = next(n for n, m in model.named_modules() if m is gpt)
    prefix = prefix + "." if prefix else ""
    for name, param in model.named_parameters():
        local = name[len(prefix) :] if name.startswith(prefix) else name
        local = local.replace("._orig_mod", "").replace("_orig_mod.", "")
        param.copy_(initial_value(gpt.config, local, seed, param.device).to(param.dtype))
    return model


def build_gpt(cfg: GPTConfig, seed: int = 0, device: torch.device | str = "cpu") -> GPT:
    """A GPT with the deterministic init for `seed`, built on `device` (meta: structure only, no init).

    The module is created on the meta device (no memory, no default init), its storage allocated on
    `device` uninitialised, then filled once by `init_gpt_weights` there: the 1.6B model never passes
    through the CPU and is never initialised twice (nn.Linear's own kaiming fill is skipped)."""
    device = torch.device(device)
    with torch.device("meta"):
        model = GPT(cfg)
    if device.type == "meta":
        return model
    model = model.to_empty(device=device)
    model.lm_head.weight = model.wte.weight  # to_empty gives each parameter its own storage: tie again
    if hasattr(model, "logit_mask"):  # to_empty left the buffer uninitialised
        model.logit_mask = pad_logit_mask(cfg, device)
    init_gpt_weights(model, seed)
    return model


# ----------------------------------------------------------------------------------------------
# the padded head layout: pad on load, strip on save (checkpoints and HF hold the unpadded weights)

_HEAD_ROWS = re.compile(r"attn\.(q|k|v|qkv)_proj\.(weight|bias)$")


def _head_axis(name: str) -> int | None:
    """The axis of a parameter that runs over head columns (0: q/k/v output rows, 1: o_proj's input
    columns), or None for a parameter the head layout does not touch."""
    if _HEAD_ROWS.search(name):
        return 0
    if name.endswith("attn.o_proj.weight"):
        return 1
    return None


def _reshape_heads(t: torch.Tensor, axis: int, width: int, new_width: int) -> torch.Tensor:
    """`t` with each `width`-wide head along `axis` cut or zero-padded to `new_width`."""
    t = t.movedim(axis, 0)
    heads = t.reshape(t.shape[0] // width, width, *t.shape[1:])
    if new_width >= width:
        heads = torch.cat([heads, heads.new_zeros(heads.shape[0], new_width - width, *heads.shape[2:])], 1)
    else:
        heads = heads[:, :new_width]
    return heads.reshape(-1, *t.shape[1:]).movedim(0, axis).contiguous()


def pad_heads(t: torch.Tensor, cfg: GPTConfig, axis: int) -> torch.Tensor:
    """A plain layout's q/k/v (axis 0) or o_proj (axis 1) tensor in `cfg`'s padded layout."""
    return _reshape_heads(t, axis, cfg.head_dim, cfg.head_width)


def pad_heads_state_dict(sd: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """Unpadded weights (a checkpoint, HF's) → `cfg`'s head layout (unchanged when plain)."""
    if not cfg.head_dim_padded:
        return sd
    return {k: v if _head_axis(k) is None else pad_heads(v, cfg, _head_axis(k)) for k, v in sd.items()}


def strip_heads_state_dict(sd: dict[str, torch.Tensor], cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """`cfg`'s head layout → the unpadded weights every checkpoint and the HF mapping hold."""
    if not cfg.head_dim_padded:
        return sd
    out = {}
    for k, v in sd.items():
        axis = _head_axis(k)
        out[k] = v if axis is None else _reshape_heads(v, axis, cfg.head_width, cfg.head_dim)
    return out


# ----------------------------------------------------------------------------------------------
# loss


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, mean over B·(T-1) predictions.

    Shifting the *targets* (last position ignored) instead of slicing the logits avoids a copy of
    the [B, T, V] logits, the largest activation of the model.
    """
    B, T, V = logits.shape
    targets = shifted_targets(tokens)
    return F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T), ignore_index=IGNORE)


# ----------------------------------------------------------------------------------------------
# HF GPT2LMHeadModel interop

_HF_LAYER = re.compile(r"^transformer\.h\.(\d+)\.(.+)$")
_OUR_LAYER = re.compile(r"^h\.(\d+)\.(.+)$")
_SIMPLE_TO_HF = {
    "wte.weight": "transformer.wte.weight",
    "wpe.weight": "transformer.wpe.weight",
    "ln_f.weight": "transformer.ln_f.weight",
    "ln_f.bias": "transformer.ln_f.bias",
    "lm_head.weight": "lm_head.weight",
}
_LAYER_SIMPLE_TO_HF = {
    "ln_1.weight": "ln_1.weight",
    "ln_1.bias": "ln_1.bias",
    "ln_2.weight": "ln_2.weight",
    "ln_2.bias": "ln_2.bias",
    "attn.o_proj.bias": "attn.c_proj.bias",
    "mlp.fc.bias": "mlp.c_fc.bias",
    "mlp.proj.bias": "mlp.c_proj.bias",
}
# Conv1D stores weight as [in, out]; nn.Linear as [out, in]
_LAYER_TRANSPOSED_TO_HF = {
    "attn.o_proj.weight": "attn.c_proj.weight",
    "mlp.fc.weight": "mlp.c_fc.weight",
    "mlp.proj.weight": "mlp.c_proj.weight",
}


def gpt_state_dict_to_hf(
    sd: dict[str, torch.Tensor], vocab_size: int | None = None, cfg: GPTConfig | None = None
) -> dict[str, torch.Tensor]:
    """Our GPT state dict → HF GPT2LMHeadModel's (q/k/v merged into c_attn, Linear → Conv1D); a padded
    embedding loses its pad rows when `vocab_size` (the real vocabulary) is given, padded heads their
    pad columns when `cfg` (the model's config, whose vocabulary is then the default) is."""
    if cfg is not None:
        sd = strip_heads_state_dict(sd, cfg)
        vocab_size = vocab_size or cfg.vocab_size
    out: dict[str, torch.Tensor] = {}
    qkv: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in sd.items():
        if key in _SIMPLE_TO_HF:
            out[_SIMPLE_TO_HF[key]] = t[:vocab_size] if key in ("wte.weight", "lm_head.weight") and vocab_size else t
            continue
        m = _OUR_LAYER.match(key)
        if not m:
            raise KeyError(f"gpt_state_dict_to_hf: unexpected key {key!r}")
        i, rest = int(m.group(1)), m.group(2)
        p = f"transformer.h.{i}."
        if rest in _LAYER_SIMPLE_TO_HF:
            out[p + _LAYER_SIMPLE_TO_HF[rest]] = t
        elif rest in _LAYER_TRANSPOSED_TO_HF:
            out[p + _LAYER_TRANSPOSED_TO_HF[rest]] = t.t().contiguous()
        elif rest == "attn.qkv_proj.weight":  # fused: already q | k | v, as c_attn
            out[p + "attn.c_attn.weight"] = t.t().contiguous()
        elif rest == "attn.qkv_proj.bias":
            out[p + "attn.c_attn.bias"] = t
        elif rest.startswith("attn.") and rest.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
            qkv.setdefault(i, {})[rest] = t
        else:
            raise KeyError(f"gpt_state_dict_to_hf: unexpected key {key!r}")
    for i, parts in qkv.items():
        p = f"transformer.h.{i}.attn."
        for leaf in ("weight", "bias"):
            pieces = [parts.get(f"attn.{n}.{leaf}") for n in ("q_proj", "k_proj", "v_proj")]
            if any(x is None for x in pieces):
                raise KeyError(f"gpt_state_dict_to_hf: layer {i} lacks one of q/k/v_proj.{leaf}")
            if leaf == "weight":
                out[p + "c_attn.weight"] = torch.cat([x.t() for x in pieces], dim=1).contiguous()
            else:
                out[p + "c_attn.bias"] = torch.cat(pieces, dim=0)
    if "transformer.wte.weight" in out and "lm_head.weight" not in out:
        out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


def gpt_state_dict_from_hf(hf_sd: dict[str, torch.Tensor], cfg: GPTConfig | None = None) -> dict[str, torch.Tensor]:
    """HF GPT2LMHeadModel state dict → ours (c_attn split into q/k/v, Conv1D → Linear); for a `cfg`
    with the levers, c_attn stays one qkv_proj, the embedding gets zero pad rows and padded heads
    their zero pad columns."""
    fused = cfg is not None and cfg.fused_qkv
    to_ours = {v: k for k, v in _SIMPLE_TO_HF.items()}
    layer_simple = {v: k for k, v in _LAYER_SIMPLE_TO_HF.items()}
    layer_t = {v: k for k, v in _LAYER_TRANSPOSED_TO_HF.items()}
    out: dict[str, torch.Tensor] = {}
    for key, t in hf_sd.items():
        if key in to_ours:
            out[to_ours[key]] = t
            continue
        m = _HF_LAYER.match(key)
        if not m:
            raise KeyError(f"gpt_state_dict_from_hf: unexpected key {key!r}")
        i, rest = int(m.group(1)), m.group(2)
        p = f"h.{i}."
        if rest in ("attn.bias", "attn.masked_bias"):
            continue  # causal-mask buffers of older transformers versions
        if rest in layer_simple:
            out[p + layer_simple[rest]] = t
        elif rest in layer_t:
            out[p + layer_t[rest]] = t.t().contiguous()
        elif fused and rest in ("attn.c_attn.weight", "attn.c_attn.bias"):
            out[p + "attn.qkv_proj." + rest.rsplit(".", 1)[1]] = t.t().contiguous() if rest.endswith("weight") else t
        elif rest == "attn.c_attn.weight":  # [C, 3C] = [in, q|k|v out]
            for name, part in zip(("q_proj", "k_proj", "v_proj"), t.chunk(3, dim=1)):
                out[p + f"attn.{name}.weight"] = part.t().contiguous()
        elif rest == "attn.c_attn.bias":
            for name, part in zip(("q_proj", "k_proj", "v_proj"), t.chunk(3, dim=0)):
                out[p + f"attn.{name}.bias"] = part.contiguous()
        else:
            raise KeyError(f"gpt_state_dict_from_hf: unexpected key {key!r}")
    if cfg is not None and "wte.weight" in out and cfg.padded_vocab > out["wte.weight"].shape[0]:
        w = out["wte.weight"]
        out["wte.weight"] = torch.cat([w, w.new_zeros(cfg.padded_vocab - w.shape[0], w.shape[1])])
        out.pop("lm_head.weight", None)
    if "wte.weight" in out and "lm_head.weight" not in out:
        out["lm_head.weight"] = out["wte.weight"]
    return out if cfg is None else pad_heads_state_dict(out, cfg)


def hf_config(cfg: GPTConfig, dropout: float = 0.0):
    """The transformers GPT2Config for `cfg` (dropout 0: same function as our GPT; HF's own layout,
    whatever our levers)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.n_positions,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        layer_norm_epsilon=cfg.layer_norm_epsilon,
        activation_function="gelu_new",
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        use_cache=False,
        # GPT-2's <|endoftext|> id does not exist in tiny vocabularies
        bos_token_id=min(50256, cfg.vocab_size - 1),
        eos_token_id=min(50256, cfg.vocab_size - 1),
    )


def build_hf_model(
    cfg: GPTConfig,
    gradient_checkpointing: bool = False,
    *,
    seed: int | None = None,
    dropout: float = 0.0,
    device: torch.device | str = "cpu",
):
    """HF `GPT2LMHeadModel` — the handout's baseline (`--impl hf`).

    With `seed`, its weights are our deterministic init for that seed (converted), drawn on `device`
    as ours are, so `--impl hf` and `--impl ours` start from identical weights. The handout's GPT2Config keeps HF's default
    dropout 0.1; we default to 0 so both implementations compute the same function (pass
    `dropout=0.1` for the literal handout model).
    """
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:  # pragma: no cover - transformers is a dependency of the GPT commands
        raise ConfigError("--impl hf needs the 'transformers' package (pip install transformers)") from None
    device = torch.device(device)
    # our levers are not HF's model
    cfg = replace(cfg, vocab_multiple=1, fused_qkv=False, head_dim_padded=0, residual_16bit=False, fused_boundary=False)
    model = None
    if seed is not None:
        # Meta first, then uninitialised storage on the device, filled once with our init below: HF's
        # own init (another single-threaded CPU fill of every weight) never runs. A transformers whose
        # GPT-2 keeps buffers (older ones: the causal mask) is built on the device the ordinary way,
        # since to_empty would leave those buffers uninitialised.
        with torch.device("meta"):
            model = GPT2LMHeadModel(hf_config(cfg, dropout))
        if any(True for _ in model.buffers()):
            model = None
        else:
            model = model.to_empty(device=device)
    if model is None:
        with torch.device(device):
            model = GPT2LMHeadModel(hf_config(cfg, dropout))
    if seed is not None:
        ours = {name: initial_value(cfg, name, seed, device) for name, _ in _canonical_param_names(cfg)}
        missing, unexpected = model.load_state_dict(gpt_state_dict_to_hf(ours), strict=False)
        missing = [k for k in missing if not k.endswith(("attn.bias", "attn.masked_bias"))]
        if missing or unexpected:
            raise RuntimeError(f"build_hf_model: state dict mismatch: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
    if gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name warns)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of an HF GPT2LMHeadModel for `tokens` (no KV cache, as in the handout's training)."""
    return model(input_ids=tokens, use_cache=False).logits
