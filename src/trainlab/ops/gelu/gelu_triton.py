"""GELU as Triton kernels (forward, backward, double backward), compiled on a GPU or interpreted.

Where the kernels run:
  * CUDA tensors: always compiled (`JITFunction`, the object `triton.jit` makes), even when
    `TRITON_INTERPRET=1` is set — `triton.jit` would then silently hand back an interpreter wrapper
    and copy every CUDA tensor through NumPy; we warn once instead and run the real kernel.
  * CPU tensors: only under Triton's interpreter — set `TRITON_INTERPRET=1` (or call with
    `interpret=True`). The interpreter executes each program instance with NumPy on the CPU; it is
    slow and exists for testing. The kernel is wrapped in `InterpretedFunction` explicitly, so the
    choice is made per call and nothing depends on when `triton` was first imported.
  * Otherwise: HardwareError, which names both ways out.

One kernel, `_gelu_kernel`, specialized at compile time by ORDER: 0 = forward y = GELU(x),
1 = backward g·GELU'(x), 2 = double backward gg·g·GELU''(x) (formulas in `gelu_math`). Offsets are
64-bit, so tensors of 2^31 elements and more (real on 141 GB GPUs) index correctly; with 16-byte
aligned pointers and sizes Triton emits 128-bit loads and stores (checked ahead of time for sm_80
and sm_90 in tests/test_gelu_triton_compile.py, no GPU needed).

bfloat16 under the interpreter (triton 3.9): NumPy has no bf16, so the interpreter carries bf16 as
raw uint16 words and converts to/from float32 in software (`_convert_float`). Widening is exact, but
narrowing float32 -> bf16 *truncates* (round toward zero, even with fp_downcast_rounding="rtne"),
which costs up to one ulp and biases results toward zero. The kernel therefore rounds to nearest
even by hand (integer bit trick) when interpreted, and uses the hardware conversion (RTNE) when
compiled; both then agree with ATen's bf16 rounding (checked in tests/test_gelu_triton.py).

Math: computed in float32 for float32/bfloat16/float16 inputs (float64 for float64). The tanh form
uses the identity (1 + tanh u)/2 = sigmoid(2u) = 1 / (1 + exp(-2u)), which needs only exp, and its
derivative uses 1 - t^2 = 4 s (1 - s), t = 2 s - 1 with s = sigmoid(2u) — exact identities, not
approximations; the double backward takes 1 - t^2 = 4e / (1 + e)^2, e = exp(-2|u|), which does not
cancel in float32 for large |u| (see gelu_math). Non-contiguous inputs are made contiguous first
(one extra read and write each).
"""

# No `from __future__ import annotations` here: Triton reads the kernels' `tl.constexpr`
# annotations as objects, and string annotations would turn the constexpr arguments into tensors.
import inspect
import os
import warnings

import torch

from trainlab.errors import HardwareError
from trainlab.ops.gelu import gelu_math

try:  # optional dependency: without it impl="triton" raises a HardwareError naming the fix
    import triton
    import triton.language as tl
except ImportError as _e:  # pragma: no cover - exercised only where triton is absent
    triton = tl = None
    _TRITON_IMPORT_ERROR = str(_e)

# Launch geometry on a GPU: `triton.autotune` over a small config set (GELU_CONFIGS), the winner
# cached per key (the element count, the pass, the form and the dtype) — in memory, and on disk where
# Triton offers it (cache_results), so a size is tuned once per machine. The set brackets PyTorch's
# element-wise loop (4 warps, 8 float32 per thread = 2 x 128-bit loads per input): 8 to 32 elements
# per thread (2 to 8 16-byte requests in flight per input and thread, 4 to 16 for 16-bit dtypes), 4
# or 8 warps. More bytes in flight per thread is what closes the gap to a copy at 256M elements.
GELU_CONFIGS = (
    (1024, 4),
    (2048, 4),
    (2048, 8),
    (4096, 4),
    (4096, 8),
    (8192, 8),
)  # (BLOCK, num_warps)
_BLOCK_INTERPRETED = 8192  # one config, no tuning: the interpreter's cost is per program instance
FORMS = {"none": 0, "tanh": 1, "sigmoid": 2}  # the FORM constexpr of each approximation

_kernels: dict = {}


if tl is not None:
    # A plain Python function; wrapped per mode (JITFunction or InterpretedFunction) in _get_kernel.
    def _gelu_kernel(
        x_ptr,
        g_ptr,
        gg_ptr,
        out_ptr,
        n,
        ORDER: tl.constexpr,
        FORM: tl.constexpr,
        F64: tl.constexpr,
        BLOCK: tl.constexpr,
        RNE_BF16: tl.constexpr,
    ):
        # FORM: 0 exact x Phi(x), 1 tanh form, 2 sigmoid form x sigmoid(1.702 x) (FORMS)
        # program_id is int32: multiply in int64, or block 2^31 / BLOCK and beyond wraps around.
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        if not F64:  # constexpr branch, resolved at compile time: 16-bit and fp32 math in fp32
            x = x.to(tl.float32)
        x2 = x * x
        if ORDER == 0:
            if FORM == 1:
                u = 0.7978845608028654 * (x + 0.044715 * x2 * x)
                r = x / (1.0 + tl.exp(-2.0 * u))  # x (1 + tanh u) / 2
            elif FORM == 2:
                r = x / (1.0 + tl.exp(-1.702 * x))  # x sigmoid(1.702 x)
            else:
                r = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
        elif ORDER == 1:
            g = tl.load(g_ptr + offs, mask=mask, other=0.0)
            if not F64:
                g = g.to(tl.float32)
            if FORM == 1:
                u = 0.7978845608028654 * (x + 0.044715 * x2 * x)
                s = 1.0 / (1.0 + tl.exp(-2.0 * u))  # (1 + tanh u) / 2
                du = 0.7978845608028654 * (1.0 + 0.134145 * x2)
                d = s + x * 2.0 * s * (1.0 - s) * du  # (1 + t)/2 + x (1 - t^2)/2 u'
            elif FORM == 2:
                z = 1.702 * x
                e = tl.exp(-tl.abs(z))
                d = 1.0 / (1.0 + tl.exp(-z)) + z * (e / ((1.0 + e) * (1.0 + e)))  # s + z s (1 - s)
            else:
                cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
                pdf = 0.3989422804014327 * tl.exp(-0.5 * x2)
                d = cdf + x * pdf
            r = g * d
        else:
            g = tl.load(g_ptr + offs, mask=mask, other=0.0)
            gg = tl.load(gg_ptr + offs, mask=mask, other=0.0)
            if not F64:
                g = g.to(tl.float32)
                gg = gg.to(tl.float32)
            if FORM == 1:
                u = 0.7978845608028654 * (x + 0.044715 * x2 * x)
                s = 1.0 / (1.0 + tl.exp(-2.0 * u))
                t = 2.0 * s - 1.0  # tanh u
                e = tl.exp(-2.0 * tl.abs(u))
                sech2 = 4.0 * e / ((1.0 + e) * (1.0 + e))  # 1 - t^2 without cancellation
                du = 0.7978845608028654 * (1.0 + 0.134145 * x2)
                d2u = 0.21406444881780076 * x  # 6 beta kappa x
                d2 = sech2 * (du + 0.5 * x * (d2u - 2.0 * t * du * du))
            elif FORM == 2:
                z = 1.702 * x
                e = tl.exp(-tl.abs(z))
                s = 1.0 / (1.0 + tl.exp(-z))
                d2 = 1.702 * (e / ((1.0 + e) * (1.0 + e))) * (2.0 + z * (1.0 - 2.0 * s))  # k A (2 + z (1 - 2s))
            else:
                d2 = 0.3989422804014327 * tl.exp(-0.5 * x2) * (2.0 - x2)  # phi (2 - x^2)
            r = gg * g * d2
        if RNE_BF16:
            # Interpreter only: its float32 -> bfloat16 cast truncates; round to nearest even by hand
            # (add 0x7FFF + the lowest kept bit, drop 16 bits; NaN keeps its truncated pattern).
            bits = r.to(tl.uint32, bitcast=True)
            rounded = bits + 0x7FFF + ((bits >> 16) & 1)
            bits = tl.where(r != r, bits, rounded)
            tl.store(out_ptr + offs, (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True), mask=mask)
        else:
            tl.store(out_ptr + offs, r.to(out_ptr.dtype.element_ty), mask=mask)


ORDERS = {"forward": 0, "backward": 1, "double_backward": 2}


def _import_triton():
    if triton is None:
        raise HardwareError(
            f"impl='triton': Triton is not installed ({_TRITON_IMPORT_ERROR}); `pip install triton` "
            "(or trainlab[triton]) or use impl='cpp'/'python'"
        )
    return triton


def kernel_object(fn, interpreted: bool):
    """One Triton kernel function (a plain function, for every kernel of trainlab) as a compiled
    JITFunction or interpreter-wrapped, cached. Never `triton.jit`, which follows TRITON_INTERPRET
    at wrap time and would interpret CUDA tensors too."""
    key = (fn, interpreted)
    if key not in _kernels:
        _import_triton()
        if interpreted:
            from triton.runtime.interpreter import InterpretedFunction

            _kernels[key] = InterpretedFunction(fn)
        else:
            from triton.runtime.jit import JITFunction

            _kernels[key] = JITFunction(fn)
    return _kernels[key]


def tuned_object(fn, interpreted: bool, configs, key: list[str], interpreted_meta: dict):
    """`fn` under `triton.autotune`: compiled, over `configs` ((meta, num_warps, num_stages) tuples),
    the fastest cached per `key` (argument names; Triton adds the tensors' dtypes) in memory and,
    where this Triton has `cache_results`, on disk; interpreted, over the one config
    `interpreted_meta` — a single config is never benchmarked, so tests under TRITON_INTERPRET=1 pay
    nothing for tuning. Built once per (kernel, mode): a launch costs one dict lookup here."""
    cache_key = (fn, interpreted, "tuned")
    tuner = _kernels.get(cache_key)
    if tuner is None:
        base = kernel_object(fn, interpreted)
        extra = {}
        if not interpreted and "cache_results" in inspect.signature(triton.autotune).parameters:
            extra["cache_results"] = True
        cfgs = (
            [triton.Config(dict(interpreted_meta))]
            if interpreted
            else [triton.Config(dict(meta), num_warps=w, num_stages=st) for meta, w, st in configs]
        )
        tuner = _kernels[cache_key] = triton.autotune(configs=cfgs, key=list(key), **extra)(base)
    return tuner


def tuning_choices() -> dict:
    """What `triton.autotune` chose in this process: {kernel: [{"key": [...], "config": "..."}, ...]} for the
    compiled kernels (the interpreter's one config is never tuned). `ops bench` records it in its JSON, so a
    GPU run shows which configs of each small set win, and which never do."""
    return {
        fn.__name__: [{"key": [str(v) for v in k], "config": str(cfg)} for k, cfg in tuner.cache.items()]
        for (fn, interpreted, *tuned), tuner in list(_kernels.items())
        if tuned and not interpreted and getattr(tuner, "cache", None)
    }


def run_launch(kernel, interpreted: bool, grid, *args, **meta) -> None:
    """kernel[grid](*args, **meta), with NumPy's warnings silenced when interpreted."""
    if interpreted:
        import numpy as np

        # NumPy warns on inf*0 and inf/inf: defined NaN results for the NaN/inf inputs the check feeds.
        with np.errstate(all="ignore"):
            kernel[grid](*args, **meta)
    else:
        kernel[grid](*args, **meta)


def _get_kernel(interpreted: bool):
    configs = [({"BLOCK": b}, w, 1) for b, w in GELU_CONFIGS]
    return tuned_object(_gelu_kernel, interpreted, configs, ["n", "ORDER", "FORM"], {"BLOCK": _BLOCK_INTERPRETED})


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


_warned_interpret_on_cuda = False


def run_mode(x: torch.Tensor, interpret: bool | None = None) -> bool:
    """True → interpreted, False → compiled; HardwareError when neither is possible (for every
    Triton kernel of trainlab: GELU's and the layers')."""
    global _warned_interpret_on_cuda
    _import_triton()
    if x.device.type == "cuda":
        if (interpret or (interpret is None and interpreter_enabled())) and not _warned_interpret_on_cuda:
            _warned_interpret_on_cuda = True
            warnings.warn(
                "trainlab: TRITON_INTERPRET is set, but trainlab's Triton kernels run compiled on CUDA "
                "tensors (the interpreter is for CPU tensors only)",
                RuntimeWarning,
                stacklevel=3,
            )
        return False
    if x.device.type == "cpu" and (interpret if interpret is not None else interpreter_enabled()):
        return True
    raise HardwareError(
        f"impl='triton': input is on {x.device} and no CUDA GPU is in use; Triton kernels need a GPU — "
        "set TRITON_INTERPRET=1 to run them in Triton's (slow) CPU interpreter, or use impl='cpp'"
    )


def run_kernel(
    order: int,
    x: torch.Tensor,
    approximate: str,
    interpret: bool | None = None,
    g: torch.Tensor | None = None,
    gg: torch.Tensor | None = None,
) -> torch.Tensor:
    """One launch of `_gelu_kernel` (ORDER 0/1/2); inputs are made contiguous, the output is too."""
    interpreted = run_mode(x, interpret)
    xc = x.contiguous()
    gc = g.contiguous() if g is not None else xc  # unused pointers: any tensor of the right dtype
    ggc = gg.contiguous() if gg is not None else xc
    out = torch.empty_like(xc)
    n = xc.numel()
    if n == 0:
        return out
    consts = dict(
        ORDER=order,
        FORM=FORMS[approximate],
        F64=x.dtype == torch.float64,
        RNE_BF16=interpreted and x.dtype == torch.bfloat16,
    )
    grid = lambda meta: (-(-n // meta["BLOCK"]),)  # noqa: E731 - BLOCK comes from the tuned config
    run_launch(_get_kernel(interpreted), interpreted, grid, xc, gc, ggc, out, n, **consts)
    return out


def gelu_fwd_triton(x: torch.Tensor, approximate: str, interpret: bool | None = None) -> torch.Tensor:
    return run_kernel(0, x, approximate, interpret)


def gelu_bwd_triton(
    grad: torch.Tensor, x: torch.Tensor, approximate: str, interpret: bool | None = None
) -> torch.Tensor:
    return run_kernel(1, x, approximate, interpret, g=grad)


class TritonGeluFunction(torch.autograd.Function):
    """y = GELU(x) by the ORDER-0 kernel; saves only x. Its backward is itself differentiable."""

    @staticmethod
    def forward(ctx, x, approximate, interpret):
        ctx.save_for_backward(x)
        ctx.approximate, ctx.interpret = approximate, interpret
        return run_kernel(0, x, approximate, interpret)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        if not torch.is_grad_enabled():  # no create_graph: one launch, without a second Function's bookkeeping
            return run_kernel(1, x, ctx.approximate, ctx.interpret, g=grad), None, None
        return TritonGeluBackward.apply(grad, x, ctx.approximate, ctx.interpret), None, None


class TritonGeluBackward(torch.autograd.Function):
    """g·GELU'(x) by the ORDER-1 kernel. Its gradients: gg·GELU'(x) (this kernel again) for g and
    gg·g·GELU''(x) (the ORDER-2 kernel) for x — so gradient penalties and Hessian-vector products
    through impl='triton' are exact."""

    @staticmethod
    def forward(ctx, grad, x, approximate, interpret):
        ctx.save_for_backward(grad, x)
        ctx.approximate, ctx.interpret = approximate, interpret
        return run_kernel(1, x, approximate, interpret, g=grad)

    @staticmethod
    def backward(ctx, gg):
        grad, x = ctx.saved_tensors
        return (
            TritonGeluBackward.apply(gg, x, ctx.approximate, ctx.interpret),
            TritonGeluDoubleBackward.apply(gg, grad, x, ctx.approximate, ctx.interpret),
            None,
            None,
        )


class TritonGeluDoubleBackward(torch.autograd.Function):
    """gg·g·GELU''(x) by the ORDER-2 kernel; the third order is torch ops (`gelu_math.bwd2_backward`)."""

    @staticmethod
    def forward(ctx, gg, grad, x, approximate, interpret):
        ctx.save_for_backward(gg, grad, x)
        ctx.approximate = approximate
        return run_kernel(2, x, approximate, interpret, g=grad, gg=gg)

    @staticmethod
    def backward(ctx, ggg):
        return (*gelu_math.bwd2_backward(ggg, *ctx.saved_tensors, ctx.approximate), None, None)


def gelu_triton(x: torch.Tensor, approximate: str = "none", interpret: bool | None = None) -> torch.Tensor:
    """GELU with the Triton kernels. `interpret=None` follows TRITON_INTERPRET for CPU tensors."""
    run_mode(x, interpret)  # fail before autograd records anything
    if not (torch.is_grad_enabled() and x.requires_grad):  # nothing to record: skip the Function's bookkeeping
        return run_kernel(0, x, approximate, interpret)
    return TritonGeluFunction.apply(x, approximate, interpret)
