r"""GELU: one entry point, five implementations, one Python reference with a hand-derived backward.

    gelu(x, impl="aten" | "python" | "cpp" | "triton" | "cuda", approximate="none" | "tanh" | "sigmoid")

Math (Hendrycks & Gimpel, 2016). With Phi the standard normal CDF and phi its density,

    exact:  y = x Phi(x) = x/2 (1 + erf(x/sqrt 2))
            dy/dx = Phi(x) + x phi(x),          phi(x) = exp(-x^2/2) / sqrt(2 pi)

    tanh:   u = sqrt(2/pi) (x + 0.044715 x^3),   t = tanh(u)
            y = x/2 (1 + t)
            dy/dx = (1 + t)/2 + x/2 (1 - t^2) du/dx,   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)

    sigmoid (report 000's third form): s = sigmoid(1.702 x)
            y = x s,   dy/dx = s + 1.702 x s (1 - s)
            F.gelu has no such form: its `aten` rung is the torch ops x * torch.sigmoid(1.702 x)

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

from trainlab.errors import ConfigError, HardwareError
from trainlab.ops.build import LIBRARY
from trainlab.ops.choices import APPROXIMATIONS as APPROXIMATIONS  # re-exported, as IMPLS
from trainlab.ops.choices import IMPLS as IMPLS
from trainlab.ops.gelu import gelu_math
from trainlab.ops.ladder import FLOAT_DTYPES, check_impl, dtype_kind, widen


def validate_options(impl: str, approximate: str) -> None:
    """ConfigError for an unknown impl or approximation (the one check, for `gelu` and `GELU`)."""
    check_impl("gelu", impl)
    if approximate not in APPROXIMATIONS:
        raise ConfigError(f"gelu approximate={approximate!r}: choose one of {', '.join(APPROXIMATIONS)}")


def validate(x: torch.Tensor, impl: str, approximate: str) -> None:
    """Raise ConfigError for unknown impl/approximate, TypeError for non-floating inputs."""
    validate_options(impl, approximate)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"gelu expects a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"gelu(impl={impl!r}) got a {dtype_kind(x.dtype)} tensor of dtype {x.dtype}; GELU is defined for "
            f"floating-point tensors ({', '.join(str(d) for d in FLOAT_DTYPES)}) — cast with x.float()"
        )


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
        ctx.save_for_backward(x)  # the backward needs x only
        ctx.approximate = approximate
        return gelu_math.forward(widen(x), approximate).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (x,) = ctx.saved_tensors
        # torch ops on the saved x: with create_graph=True autograd records them, so the double
        # backward (and any higher order) of the python impl is exact without further code.
        return (widen(grad) * gelu_math.derivative(widen(x), ctx.approximate)).to(x.dtype), None


def gelu_python(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return GeluFunction.apply(x, approximate)


# ---- cpp / cuda: the C++ extension ------------------------------------------------------------
#
# `LIBRARY` is trainlab's one compiled library (ops/build.py); GELU's part is gelu_cpu.cpp, plus
# gelu_cuda.cpp (ATen glue) and gelu_cuda_kernels.cu (CUDA-only kernels) on a CUDA machine, all in this
# folder. It defines, with CPU/CUDA kernels,
#
#     trainlab::gelu_fwd(Tensor x, str approximate)                          y = GELU(x)
#     trainlab::gelu_bwd(Tensor grad, Tensor x, str approximate)             grad * GELU'(x)
#     trainlab::gelu_bwd2(Tensor grad_grad, Tensor grad, Tensor x, str a)    grad_grad * grad * GELU''(x)
#
# with their autograd formulas (C++, except gelu_bwd2's), and `_register` (run by `LIBRARY.on_load`)
# adds the rest and the fakes (shape-only), so `torch.compile(fullgraph=True)` traces the ops and
# `torch.library.opcheck` passes. Each op's autograd formula uses the next op, so
# every order is exact: gelu_fwd → gelu_bwd → (gelu_bwd, gelu_bwd2) → torch ops (gelu_math.bwd2_backward).


def load(verbose: bool = False) -> dict:
    """Build (once) and load the library with GELU's kernels;
    returns {'name', 'build_dir', 'cuda', 'cpu_capability'}."""
    return LIBRARY.load(verbose)


def _register(with_cuda: bool) -> None:
    """Autograd formulas and fake implementations for the C++-defined ops."""

    @torch.library.register_fake("trainlab::gelu_fwd")
    def _gelu_fwd_fake(x, approximate):
        return torch.empty_like(x)

    @torch.library.register_fake("trainlab::gelu_bwd")
    def _gelu_bwd_fake(grad, x, approximate):
        return torch.empty_like(x)

    @torch.library.register_fake("trainlab::gelu_bwd2")
    def _gelu_bwd2_fake(grad_grad, grad, x, approximate):
        return torch.empty_like(x)

    # gelu_fwd's and gelu_bwd's autograd formulas are C++ (gelu_cpu.cpp: a Python formula put
    # the interpreter, and on a GPU the GIL, into every backward); gelu_bwd2's third order is torch ops.
    def _save_inputs(ctx, inputs, output):
        *tensors, approximate = inputs
        ctx.save_for_backward(*tensors)
        ctx.approximate = approximate

    def _bwd2_backward(ctx, ggg):
        return (*gelu_math.bwd2_backward(ggg, *ctx.saved_tensors, ctx.approximate), None)

    torch.library.register_autograd("trainlab::gelu_bwd2", _bwd2_backward, setup_context=_save_inputs)


LIBRARY.on_load(_register)


def gelu_cpp(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU through the compiled `trainlab::gelu_fwd` op (differentiable).

    Under torch.compile the op is traced like any ATen op (fake impl + autograd formula registered
    in `load`). The first call must happen outside the compiled region (or call `load()` first, as
    `GELU(impl="cpp")` does in its constructor): building takes a lock Dynamo cannot trace.
    """
    LIBRARY.ensure()  # outside any lock when loaded, so torch.compile never traces the build lock
    return torch.ops.trainlab.gelu_fwd(x, approximate)


def gelu_cuda(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU through the extension's CUDA kernel; x must live on a CUDA device."""
    if not torch.cuda.is_available():
        raise HardwareError(
            f"impl='cuda': no CUDA GPU is available (torch {torch.__version__}); use impl='cpp' or impl='python' on CPU"
        )
    if x.device.type != "cuda":
        raise HardwareError(
            f"impl='cuda': input is on {x.device}, expected a CUDA tensor; move it with "
            "x.cuda() or use impl='cpp' for CPU tensors"
        )
    LIBRARY.require_cuda()
    return torch.ops.trainlab.gelu_fwd(x, approximate)


# ---- dispatch ----------------------------------------------------------------------------------


def gelu(x: torch.Tensor, impl: str = "aten", approximate: str = "none") -> torch.Tensor:
    """GELU of `x` with the chosen implementation; differentiable for every impl.

    impl: aten (F.gelu, the reference) | python (autograd.Function) | cpp (fused C++ op,
    `trainlab::gelu_fwd`) | triton (Triton kernels; GPU, or CPU under TRITON_INTERPRET=1) |
    cuda (the extension's CUDA kernel; needs a GPU).
    Raises ConfigError for an unknown impl/approximate, TypeError for integer/complex/bool inputs,
    HardwareError when the impl cannot run here (no compiler, no GPU).
    """
    validate(x, impl, approximate)
    if impl == "aten":
        return gelu_math.aten(x, approximate)
    if impl == "python":
        return gelu_python(x, approximate)
    if impl == "cpp":
        return gelu_cpp(x, approximate)
    if impl == "cuda":
        return gelu_cuda(x, approximate)
    from trainlab.ops.gelu.gelu_triton import gelu_triton  # imports Triton: only when asked for

    return gelu_triton(x, approximate)


class GELU(nn.Module):
    """nn.Module wrapper: `GELU(impl="cpp")` drops in where `nn.GELU()` was."""

    def __init__(self, impl: str = "aten", approximate: str = "none"):
        super().__init__()
        validate_options(impl, approximate)
        self.impl = impl
        self.approximate = approximate
        if impl == "cpp" or (impl == "cuda" and torch.cuda.is_available()):
            # Build/load the extension now, outside any torch.compile region: the first load takes
            # a lock and may run the compiler, which Dynamo cannot trace (fullgraph would fail).
            LIBRARY.load()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu(x, impl=self.impl, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"impl={self.impl!r}, approximate={self.approximate!r}"


# ---- its check cases and autograd-table hooks (ops/check.py; cases.py imports the entry point above) ----

from trainlab.ops.gelu.cases import BENCH, CASES, DOUBLE_BACKWARD, DTYPES, REGISTERED, gradcheck_case, opcheck  # noqa: E402,F401
