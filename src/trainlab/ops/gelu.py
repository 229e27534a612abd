r"""GELU: one entry point, five implementations, one Python reference with a hand-derived backward.

    gelu(x, impl="torch" | "python" | "cpp" | "triton" | "cuda", approximate="none" | "tanh")

Math (Hendrycks & Gimpel, 2016). With Phi the standard normal CDF and phi its density,

    exact:  y = x Phi(x) = x/2 (1 + erf(x/sqrt 2))
            dy/dx = Phi(x) + x phi(x),          phi(x) = exp(-x^2/2) / sqrt(2 pi)

    tanh:   u = sqrt(2/pi) (x + 0.044715 x^3),   t = tanh(u)
            y = x/2 (1 + t)
            dy/dx = (1 + t)/2 + x/2 (1 - t^2) du/dx,   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)

Derivation of the exact backward: product rule on x Phi(x) gives Phi(x) + x Phi'(x) and Phi' = phi.
For tanh: product rule on x/2 (1 + t), chain rule t' = (1 - t^2) u'. Both backward passes need only
the input x (not y), so the autograd functions save x alone, exactly as ATen's `gelu_backward` does.

Edge values follow float64 F.gelu (the reference): NaN -> NaN; y(+inf) = +inf; y(-inf) = NaN
(it evaluates -inf * 0); the gradient at +-inf is NaN (inf * 0 in x phi(x)).

Higher orders (gradient penalties, Hessian-vector products): every impl differentiates exactly to any
order. `python` is built from torch ops, so autograd differentiates its backward; `cpp`/`cuda`
register the backward op's own derivative (a `gelu_bwd2` kernel computing gg g d'(x)), and `triton`
does the same with a third kernel; the second and third derivatives are in `gelu_math`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainlab.errors import ConfigError
from trainlab.ops import gelu_cpp, gelu_math

IMPLS = ("torch", "python", "cpp", "triton", "cuda")
APPROXIMATIONS = ("none", "tanh")
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def validate_options(impl: str, approximate: str) -> None:
    """ConfigError for an unknown impl or approximation (the one check, for `gelu` and `GELU`)."""
    if impl not in IMPLS:
        raise ConfigError(f"gelu impl={impl!r}: unknown implementation; choose one of {', '.join(IMPLS)}")
    if approximate not in APPROXIMATIONS:
        raise ConfigError(f"gelu approximate={approximate!r}: choose one of {', '.join(APPROXIMATIONS)}")


def validate(x: torch.Tensor, impl: str, approximate: str) -> None:
    """Raise ConfigError for unknown impl/approximate, TypeError for non-floating inputs."""
    validate_options(impl, approximate)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"gelu expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        kind = ("complex" if x.dtype.is_complex else "boolean" if x.dtype == torch.bool
                else "integer" if not x.dtype.is_floating_point else "unsupported floating-point")
        raise TypeError(f"gelu(impl={impl!r}) got a {kind} tensor of dtype {x.dtype}; GELU is defined for "
                        f"floating-point tensors ({', '.join(str(d) for d in SUPPORTED_DTYPES)}) — cast with x.float()")


# ---- python: the reference autograd.Function ---------------------------------------------------

class GeluFunction(torch.autograd.Function):
    """GELU written with torch element-wise ops and the backward derived above (module docstring).

    Built from ~6 (exact) or ~9 (tanh) separate element-wise kernels, each reading and writing the
    whole tensor, so it moves several times the memory of a fused kernel: correct, but slow — the
    benchmark reports by how much. bfloat16/float16 inputs are computed in float32 and rounded once,
    as ATen does, so the result is comparable to F.gelu.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        ctx.save_for_backward(x)   # the backward needs x only
        ctx.approximate = approximate
        xc = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x
        return gelu_math.forward(xc, approximate).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        # torch ops on the saved x: with create_graph=True autograd records them, so the double
        # backward (and any higher order) of the python impl is exact without further code.
        if x.dtype in (torch.bfloat16, torch.float16):
            return (grad.float() * gelu_math.derivative(x.float(), ctx.approximate)).to(x.dtype), None
        return grad * gelu_math.derivative(x, ctx.approximate), None


def gelu_python(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return GeluFunction.apply(x, approximate)


# ---- dispatch ----------------------------------------------------------------------------------

def gelu(x: torch.Tensor, impl: str = "torch", approximate: str = "none") -> torch.Tensor:
    """GELU of `x` with the chosen implementation; differentiable for every impl.

    impl: torch (F.gelu, the reference) | python (autograd.Function) | cpp (fused C++ op,
    `trainlab::gelu_fwd`) | triton (Triton kernels; GPU, or CPU under TRITON_INTERPRET=1) |
    cuda (the extension's CUDA kernel; needs a GPU).
    Raises ConfigError for an unknown impl/approximate, TypeError for integer/complex/bool inputs,
    HardwareError when the impl cannot run here (no compiler, no GPU).
    """
    validate(x, impl, approximate)
    if impl == "torch":
        return F.gelu(x, approximate=approximate)
    if impl == "python":
        return gelu_python(x, approximate)
    if impl == "cpp":
        return gelu_cpp.gelu_cpp(x, approximate)
    if impl == "cuda":
        return gelu_cpp.gelu_cuda(x, approximate)
    from trainlab.ops.gelu_triton import gelu_triton  # imports Triton: only when asked for

    return gelu_triton(x, approximate)


class GELU(nn.Module):
    """nn.Module wrapper: `GELU(impl="cpp")` drops in where `nn.GELU()` was."""

    def __init__(self, impl: str = "torch", approximate: str = "none"):
        super().__init__()
        validate_options(impl, approximate)
        self.impl = impl
        self.approximate = approximate
        if impl == "cpp" or (impl == "cuda" and torch.cuda.is_available()):
            # Build/load the extension now, outside any torch.compile region: the first load takes
            # a lock and may run the compiler, which Dynamo cannot trace (fullgraph would fail).
            gelu_cpp.load()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu(x, impl=self.impl, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"impl={self.impl!r}, approximate={self.approximate!r}"
