"""GELU as Triton kernels (forward and backward), compiled on a GPU or run by Triton's interpreter.

Where the kernels run:
  * CUDA tensors: compiled with `triton.jit` (the normal path on a GPU).
  * CPU tensors: only under Triton's interpreter — set `TRITON_INTERPRET=1` (or call with
    `interpret=True`). The interpreter executes each program instance with NumPy on the CPU; it is
    slow and exists for testing. The kernels are wrapped in `InterpretedFunction` explicitly, so
    the choice is made per call and nothing depends on when `triton` was first imported.
  * Otherwise: HardwareError, which names both ways out.

bfloat16 under the interpreter (triton 3.9): NumPy has no bf16, so the interpreter carries bf16 as
raw uint16 words and converts to/from float32 in software (`_convert_float`). Widening is exact, but
narrowing float32 -> bf16 *truncates* (round toward zero, even with fp_downcast_rounding="rtne"),
which costs up to one ulp and biases results toward zero. The kernels therefore round to nearest
even by hand (integer bit trick) when interpreted, and use the hardware conversion (RTNE) when
compiled; both then agree with ATen's bf16 rounding (checked in tests/test_gelu_triton.py).

Math: computed in float32 for float32/bfloat16/float16 inputs (float64 for float64). The tanh form
uses the identity (1 + tanh u)/2 = sigmoid(2u) = 1 / (1 + exp(-2u)), which needs only exp, and its
backward (1 - t^2)/2 = 2 s (1 - s) with s = sigmoid(2u) — exact identities, not approximations.
Non-contiguous inputs are made contiguous first (one extra read and write of the input).
"""

# No `from __future__ import annotations` here: Triton reads the kernels' `tl.constexpr`
# annotations as objects, and string annotations would turn the constexpr arguments into tensors.
import os

import torch

from trainlab.errors import HardwareError

try:  # optional dependency: without it impl="triton" raises a HardwareError naming the fix
    import triton
    import triton.language as tl
except ImportError as _e:  # pragma: no cover - exercised only where triton is absent
    triton = tl = None
    _TRITON_IMPORT_ERROR = str(_e)

_BLOCK_GPU = 1024        # 4 warps x 32 lanes x 8 elements: 16-byte accesses per lane for fp32 x4 / bf16 x8
_BLOCK_INTERPRETED = 8192  # fewer, larger NumPy calls: the interpreter's cost is per program instance

_kernels: dict = {}


if tl is not None:
    # Plain Python functions; wrapped per mode (triton.jit or InterpretedFunction) in _get_kernels.
    def _gelu_fwd_kernel(x_ptr, y_ptr, n, TANH: tl.constexpr, F64: tl.constexpr, BLOCK: tl.constexpr,
                         RNE_BF16: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        if F64:   # constexpr branch: resolved at compile time
            x = x.to(tl.float64)
        else:
            x = x.to(tl.float32)
        if TANH:
            u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            y = x / (1.0 + tl.exp(-2.0 * u))            # x (1 + tanh u) / 2
        else:
            y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
        if RNE_BF16:
            # Interpreter only: its float32 -> bfloat16 cast truncates; round to nearest even by hand
            # (add 0x7FFF + the lowest kept bit, drop 16 bits; NaN keeps its truncated pattern).
            bits = y.to(tl.uint32, bitcast=True)
            rounded = bits + 0x7FFF + ((bits >> 16) & 1)
            bits = tl.where(y != y, bits, rounded)
            tl.store(y_ptr + offs, (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
        else:
            tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


    def _gelu_bwd_kernel(g_ptr, x_ptr, dx_ptr, n, TANH: tl.constexpr, F64: tl.constexpr, BLOCK: tl.constexpr,
                         RNE_BF16: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        if F64:
            g = g.to(tl.float64)
            x = x.to(tl.float64)
        else:
            g = g.to(tl.float32)
            x = x.to(tl.float32)
        if TANH:
            x2 = x * x
            u = 0.7978845608028654 * (x + 0.044715 * x2 * x)
            s = 1.0 / (1.0 + tl.exp(-2.0 * u))           # (1 + tanh u) / 2
            du = 0.7978845608028654 * (1.0 + 0.134145 * x2)
            d = s + x * 2.0 * s * (1.0 - s) * du          # (1 + t)/2 + x (1 - t^2)/2 u'
        else:
            cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
            pdf = 0.3989422804014327 * tl.exp(-0.5 * x * x)
            d = cdf + x * pdf
        dx = g * d
        if RNE_BF16:   # see the forward kernel
            bits = dx.to(tl.uint32, bitcast=True)
            rounded = bits + 0x7FFF + ((bits >> 16) & 1)
            bits = tl.where(dx != dx, bits, rounded)
            tl.store(dx_ptr + offs, (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
        else:
            tl.store(dx_ptr + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _import_triton():
    if triton is None:
        raise HardwareError(f"impl='triton': Triton is not installed ({_TRITON_IMPORT_ERROR}); `pip install triton` "
                            "(or trainlab[triton]) or use impl='cpp'/'python'")
    return triton


def _get_kernels(interpreted: bool):
    """(fwd, bwd) kernel objects: compiled JIT functions, or interpreter-wrapped ones."""
    key = "interp" if interpreted else "jit"
    if key not in _kernels:
        _import_triton()
        if interpreted:
            from triton.runtime.interpreter import InterpretedFunction

            _kernels[key] = (InterpretedFunction(_gelu_fwd_kernel), InterpretedFunction(_gelu_bwd_kernel))
        else:
            _kernels[key] = (triton.jit(_gelu_fwd_kernel), triton.jit(_gelu_bwd_kernel))
    return _kernels[key]


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def _mode(x: torch.Tensor, interpret: bool | None) -> bool:
    """True → interpreted, False → compiled; raises when neither is possible."""
    _import_triton()
    if x.device.type == "cuda":
        return False
    if x.device.type == "cpu" and (interpret if interpret is not None else interpreter_enabled()):
        return True
    raise HardwareError(
        f"impl='triton': input is on {x.device} and no CUDA GPU is in use; Triton kernels need a GPU — "
        "set TRITON_INTERPRET=1 to run them in Triton's (slow) CPU interpreter, or use impl='cpp'")


def _launch(kernel, n: int, interpreted: bool, *args, tanh: bool, f64: bool):
    block = _BLOCK_INTERPRETED if interpreted else _BLOCK_GPU
    rne = interpreted and args[-1].dtype == torch.bfloat16   # args[-1] is the output tensor
    grid = (max(1, -(-n // block)),)
    if interpreted:
        import numpy as np

        # NumPy warns on inf*0 and inf/inf, which are the defined NaN results at x = +-inf.
        with np.errstate(all="ignore"):
            kernel[grid](*args, n, TANH=tanh, F64=f64, BLOCK=block, RNE_BF16=rne)
    else:
        kernel[grid](*args, n, TANH=tanh, F64=f64, BLOCK=block, RNE_BF16=rne)


def gelu_fwd_triton(x: torch.Tensor, approximate: str, interpret: bool | None = None) -> torch.Tensor:
    interpreted = _mode(x, interpret)
    fwd, _ = _get_kernels(interpreted)
    xc = x.contiguous()
    y = torch.empty_like(xc)
    if xc.numel():
        _launch(fwd, xc.numel(), interpreted, xc, y, tanh=approximate == "tanh", f64=x.dtype == torch.float64)
    return y


def gelu_bwd_triton(grad: torch.Tensor, x: torch.Tensor, approximate: str, interpret: bool | None = None) -> torch.Tensor:
    interpreted = _mode(x, interpret)
    _, bwd = _get_kernels(interpreted)
    gc, xc = grad.contiguous(), x.contiguous()
    dx = torch.empty_like(xc)
    if xc.numel():
        _launch(bwd, xc.numel(), interpreted, gc, xc, dx, tanh=approximate == "tanh", f64=x.dtype == torch.float64)
    return dx


class TritonGeluFunction(torch.autograd.Function):
    """Autograd glue: forward and backward are the two Triton kernels; saves only x."""

    @staticmethod
    def forward(ctx, x, approximate, interpret):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        ctx.interpret = interpret
        return gelu_fwd_triton(x, approximate, interpret)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return gelu_bwd_triton(grad, x, ctx.approximate, ctx.interpret), None, None


def gelu_triton(x: torch.Tensor, approximate: str = "none", interpret: bool | None = None) -> torch.Tensor:
    """GELU with the Triton kernels. `interpret=None` follows TRITON_INTERPRET for CPU tensors."""
    _mode(x, interpret)   # fail before autograd records anything
    return TritonGeluFunction.apply(x, approximate, interpret)
