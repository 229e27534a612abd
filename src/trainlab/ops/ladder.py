"""The operator ladder, written once for every operator (gelu, conv2d, max_pool2d, linear, relu).

Each operator has the same five rungs, from the baseline to our own GPU kernels:

    aten     PyTorch's own kernel (F.gelu, F.conv2d, …): the baseline every check and ratio is taken against
    python   an autograd.Function of torch ops with the backward derived by hand: the readable reference
    cpp      our C++ extension's CPU kernels, registered as `trainlab::` operators (ops/build.py)
    triton   our Triton kernels (a GPU, or Triton's interpreter on CPU tensors under TRITON_INTERPRET=1)
    cuda     the same C++ operators' CUDA kernels (a GPU and a CUDA build)

This module holds what the rungs share: their names, the dtypes they are checked in and the
tolerances, the one "compute reduced precision in float32" rule, whether a rung can run on this
machine (and where), and getting a compiled rung ready.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainlab.errors import ConfigError
from trainlab.ops.choices import DTYPE_BYTES, IMPLS

DTYPES = {name: getattr(torch, name) for name in DTYPE_BYTES}  # checked in
DEFAULT_DTYPES = ("float32", "bfloat16")  # `ops check`'s default for an operator without DTYPES of its own
FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)  # what every rung accepts
REDUCED = (torch.bfloat16, torch.float16)
# The rungs whose conv2d_relu / linear_relu is one forward kernel (the ReLU in the GEMM's epilogue; the
# backward masks dy once, then runs the layer's GEMMs); every other rung runs its layer and then its relu.
RELU_EPILOGUE_IMPLS = ("triton",)


def dtype_kind(dtype: torch.dtype) -> str:
    """What a dtype that no rung accepts is, in words, for the one-line refusal."""
    if dtype.is_complex:
        return "complex"
    if dtype == torch.bool:
        return "boolean"
    return "integer" if not dtype.is_floating_point else "unsupported floating-point"


def widen(t: torch.Tensor | None) -> torch.Tensor | None:
    """bfloat16/float16 → float32, anything else unchanged: every rung computes reduced precision in
    float32 and rounds once at the end, as ATen does, so the rungs stay comparable to it."""
    return t.float() if t is not None and t.dtype in REDUCED else t


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class Tolerance:
    """|err| <= atol * S + rtol * |ref| elementwise, on finite reference values. S is the size of the
    computation: 1 for an element-wise op (scaled by max|grad_out| for a gradient), the same
    computation on absolute values for a sum of products (see check.py)."""

    atol: float
    rtol: float


TOLERANCES = {
    # Element-wise ops (gelu): one function evaluation per element.
    #   float64  Sleef/libm erf, exp, tanh are accurate to ~1 ulp (2.2e-16); margin for a few roundings.
    #   float32  float32 erf approximations (ATen's Abramowitz–Stegun fit, our rational fit, libdevice)
    #            are within ~4e-7 absolute of erf; GELU multiplies that by x/2, <= 1e-6 for |x| <= 5.
    #   bfloat16 math in float32 then one rounding to an 8-bit significand: one full ulp (2^-7).
    "elementwise": {
        torch.float64: Tolerance(1e-13, 1e-12),
        torch.float32: Tolerance(2e-6, 2e-6),
        torch.bfloat16: Tolerance(1e-5, 2.0**-7),
    },
    # Sums of products and selections (conv2d, linear, max_pool2d, relu), S as in check.py:
    #   float64  k <= ~10^4 terms, ~100x margin on the typical error;
    #   float32  u sqrt(k) S is ~1e-5 S for k ~ 10^4 (dW of conv1);
    #   bfloat16 float32 math, one rounding: half a bf16 ulp of |ref| on top.
    "sum": {
        torch.float64: Tolerance(1e-12, 0.0),
        torch.float32: Tolerance(2e-5, 0.0),
        torch.bfloat16: Tolerance(2e-5, 2.0**-8),
    },
}


def check_impl(op: str, impl: str) -> None:
    if impl not in IMPLS:
        raise ConfigError(f"{op} impl={impl!r}: unknown implementation; choose one of {', '.join(IMPLS)}")


def availability(impl: str) -> tuple[str | None, torch.device]:
    """(reason the rung cannot run here, or None; the device it runs on). Triton without a GPU runs
    interpreted on the CPU."""
    if impl == "cuda" and not torch.cuda.is_available():
        return "no CUDA GPU on this machine", torch.device("cpu")
    if impl == "triton":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "triton is not installed", torch.device("cpu")
    gpu = impl == "cuda" or (impl == "triton" and torch.cuda.is_available())
    return None, torch.device("cuda" if gpu else "cpu")


def mode(impl: str, device: torch.device) -> str:
    """eager (torch ops), compiled (our kernels) or interpreted (Triton on the CPU)."""
    if impl == "triton":
        return "compiled" if device.type == "cuda" else "interpreted"
    return "eager" if impl in ("aten", "python") else "compiled"


@contextlib.contextmanager
def triton_interpreter_if_cpu(impl: str):
    """Interpreted Triton for CPU rows: TRITON_INTERPRET=1 for the duration (restored after)."""
    if impl != "triton" or torch.cuda.is_available():
        yield
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


# ---- check cases: each operator file lists its own (see check.py for how a row is judged) ----------


@dataclass(frozen=True)
class Case:
    """One shape case: `make(size, gen)` returns float64 inputs (name -> tensor, or a non-tensor
    argument), `view` turns the cast inputs into the layouts under test, `call(inputs, impl)` runs
    the operator. `bilinear` ops get S from |inputs|; selections from the reference's own routing."""

    op: str
    name: str
    make: Callable
    call: Callable
    bilinear: bool
    view: Callable | None = None
    edge: bool = False  # contains NaN/inf: compare the non-finite pattern too
    # (inputs64, dy64, grad) -> (S of the output, {input name: S of its gradient}) for an op that is
    # neither a plain sum of products nor a plain selection (a fused conv → relu → pool, GELU).
    # inputs64 and dy64 live on the rung's device; take gradients with `grad` (autograd.grad that
    # checks every tensor is on that device, ops/check.py)
    bound: Callable | None = None
    # the rungs checked in bfloat16/float16 (None: all). A rung that composes three ops rounds the
    # intermediate results, which moves a pooling's winners: its reduced-precision rows are skipped
    # with that reason rather than compared against a float64 routing they cannot follow.
    reduced_impls: tuple[str, ...] | None = None
    tolerance: str = "sum"  # the TOLERANCES family: "sum" (sums of products, selections) or "elementwise"
    sized_by: str = "batch"  # what `make` gets as its size: the check's --batch, or --n (elements)
    variant: str | None = None  # an operator's named variant the case runs (GELU's approximation)
    # (impl, dtype, device) -> {name: value, ..., "ok": bool}: checks of the case's own, in the row's `checks`
    extra: Callable | None = None
    impls: tuple[str, ...] | None = None  # the rungs that have what the case runs (None: all)


@dataclass(frozen=True)
class Layer:
    """A LeNet-5 layer that `ops bench` times, at batch `b`: `inputs(b, gen)` makes its tensors,
    `run(t, impl)` its forward. Each operator's folder lists its own (`BENCH`); `order` is the
    layer's place in LeNet-5, which the bench table follows."""

    name: str
    op: str
    inputs: Callable
    run: Callable
    order: float
    input_needs_grad: bool = True
    # the step totals it counts in (bench.STEPS): the layers one by one, and/or the step whose conv and
    # linear layers carry their ReLU (relu-epilogue); () for a stage that only repeats timed layers
    steps: tuple[str, ...] = ("layers",)


def randn64(gen, *shape) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=gen)


def every_other_column(t: dict) -> dict:
    return {**t, "x": t["x"][..., ::2]}  # a strided, non-contiguous view
