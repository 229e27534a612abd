"""Which kernel `F.scaled_dot_product_attention` runs for our GPT, decided the way PyTorch decides it.

The memory planner cannot assume "fused attention, no s×s matrix": that holds only for some dtypes
and head widths. PyTorch's choice (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
`select_sdp_backend`; CPU: sdp_utils_cpp.cpp) for causal self-attention without mask or dropout,
q/k/v of equal shape, as our model calls it (rules identical in torch 2.11-2.13):

  CUDA, priority order cuDNN (only where preferred, below) → flash → memory-efficient → math:
    cuDNN      fp16/bf16, sm80-sm121, head_dim a multiple of 8 and <= 128 for training; preferred
               over flash on sm90/sm100 with cuDNN > 9.15 (check_prefer_cudnn_attention)
    flash      fp16/bf16 (sm80+), head_dim <= 256, sm80-sm121; heads whose width is not a multiple
               of 8 are padded to one by SDPA itself (attention.cpp pad_last_dim<8>): GPT-2 1.6B's
               head_dim 50 runs as 56, and the padded q, k, v and output are what backward keeps
    efficient  fp16/fp32/bf16 on sm80+ (fp16/fp32 below), head_dim a multiple of the GEMM alignment
               (minimum_gemm_alignment: 4 for fp32 on sm80+, 8 for 16-bit)
    math       always: explicit softmax(QKᵀ)V, which stores the s×s probabilities of every head
               for backward (4 bytes per entry in fp32)
  CPU: flash (the CPU kernel) for fp32/fp64/bf16/fp16 without dropout, any head width; else math.

So GPT-2 1.6B (head_dim 50) on an H100: bf16 autocast → flash with heads padded 50→56; fp32 →
neither flash (dtype) nor efficient (50 % 4 != 0) → math, ≈1 GiB of scores per layer at micro-batch
8 (48 GiB over 48 layers). A GPU test checks these choices against the kernel torch actually runs.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("fp32", "bf16", "fp16")
# The cuDNN version PyPI's torch 2.13.0 CUDA wheel ships (nvidia-cudnn-cu13 9.20), assumed when unknown.
DEFAULT_CUDNN_VERSION = 92000


@dataclass(frozen=True)
class AttentionChoice:
    backend: str  # flash | efficient | cudnn | math (CUDA); flash-cpu | math (CPU)
    head_dim: int
    padded_head_dim: int  # what the kernel stores q, k, v and the output at
    stores_scores: bool  # the math path keeps softmax(QKᵀ) (heads × s × s) for backward
    why: str

    @property
    def label(self) -> str:
        if self.padded_head_dim != self.head_dim:
            return f"{self.backend} (heads padded {self.head_dim}→{self.padded_head_dim})"
        if self.stores_scores:
            return f"{self.backend} (stores s×s scores)"
        return self.backend


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def choose(
    head_dim: int, dtype: str, device_type: str = "cuda", sm: int = 90, cudnn_version: int | None = None
) -> AttentionChoice:
    """The backend SDPA picks for a training step (inputs require grad) of causal self-attention.

    `dtype` is the dtype q/k/v have when SDPA runs ("fp32"; "bf16"/"fp16" under autocast), `sm` the
    compute capability × 10 (80 A100, 90 H100/H200), `cudnn_version` as torch.backends.cudnn.version()."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if device_type == "cpu":
        return AttentionChoice(
            "flash-cpu",
            head_dim,
            head_dim,
            False,
            "CPU flash kernel: fp32/fp64/bf16/fp16, any head width (sdp_utils_cpp.cpp)",
        )
    if device_type != "cuda":
        raise ValueError(f"device_type {device_type!r}: expected cuda or cpu")
    half = dtype in ("bf16", "fp16")
    major = sm // 10
    cudnn = DEFAULT_CUDNN_VERSION if cudnn_version is None else cudnn_version
    fused_arch = 80 <= sm <= 121
    if half and fused_arch and major in (9, 10) and cudnn > 91500 and head_dim % 8 == 0 and head_dim <= 128:
        return AttentionChoice(
            "cudnn",
            head_dim,
            head_dim,
            False,
            f"{dtype}, head_dim {head_dim} % 8 == 0 and <= 128, sm{sm} with cuDNN {cudnn} > 9.15: "
            "cuDNN attention is preferred",
        )
    if half and fused_arch and head_dim <= 256:
        padded = _round_up(head_dim, 8)
        why = f"{dtype}, head_dim {head_dim} <= 256 on sm{sm}"
        if padded != head_dim:
            why += f"; not a multiple of 8: SDPA pads q, k, v to {padded} and backward keeps the padded copies"
        return AttentionChoice("flash", head_dim, padded, False, why)
    align = 4 if (dtype == "fp32" and sm >= 80) else 8 if half else 1
    eff_dtype_ok = dtype in ("fp32", "fp16") or (dtype == "bf16" and sm >= 80)
    if 50 <= sm <= 121 and eff_dtype_ok and head_dim % align == 0:
        return AttentionChoice(
            "efficient",
            head_dim,
            head_dim,
            False,
            f"{dtype}, head_dim {head_dim} % {align} == 0 (GEMM alignment on sm{sm})",
        )
    reasons = []
    if not half:
        reasons.append("flash and cuDNN need fp16/bf16")
    elif not fused_arch:
        reasons.append(f"flash needs sm80-sm121, not sm{sm}")
    if head_dim % align:
        reasons.append(f"memory-efficient needs head_dim % {align} == 0, got {head_dim}")
    return AttentionChoice("math", head_dim, head_dim, True, "; ".join(reasons) or "no fused kernel applies")
