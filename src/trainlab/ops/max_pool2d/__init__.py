r"""max_pool2d: one entry point, a ladder of implementations, a Python reference.

    max_pool2d(x, kernel_size, stride=None, padding=0, impl="aten" | "python" | "cpp" | "triton" | "cuda")
    MaxPool2d(kernel_size, stride=None, padding=0, impl="cpp")   # drop-in for nn.MaxPool2d

Forward: each output is the largest element of its KH x KW window (windows start every `stride`
elements of the input padded with -inf). The backward needs to know which element won, so the
forward also records it — per output, the window-local position k = p*KW + q of the winner:

    y[n, c, i, j]  = max_{p, q} xpad[n, c, i*S + p, j*S + q],      k[n, c, i, j] = argmax
    dx[n, c, h, w] = sum over the windows (i, j) whose winner is (h, w) of dy[n, c, i, j]

The maximum is piecewise the identity on one input, so its derivative routes each dy to exactly
one input element; with stride >= kernel (LeNet's 2x2/2) the windows do not overlap and every input
receives at most one gradient, otherwise the contributions add up. Ties and NaN follow ATen to the
bit: scan p then q, replace the running max when v > max or v is NaN — so the first maximum wins,
and any NaN in a window wins over numbers (and propagates, as it must).

The ladder: `python` loops over the KH*KW window offsets, each one strided slice of the padded
input (4 slices for 2x2), vectorized over everything else by torch. `cpp` is a parallel loop over
(sample, channel) planes that saves a one-byte window index instead of ATen's int64 plane offset
and, in the backward, zeroes and fills one small plane at a time while it is in L1 (ATen zeroes the
whole gradient, then scatters into it). `triton` and `cuda` compute the backward as a *gather* —
one thread per input element collects the gradients of the windows that chose it — where a
thread per output would have to scatter with atomic adds whenever windows overlap; the CUDA build
also ships that naive atomic scatter (`max_pool2d_bwd_atomic`) so the benchmark can show the
difference.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainlab.ops.ladder import Case, Layer, check_impl, every_other_column, randn64, widen
from trainlab.ops.layers.layer_args import check_device, check_max_pool2d, pool_index_dtype, pool_output_hw
from trainlab.ops.layers.layers_cpp import compiled_rung, prepare

# ---- python: the reference autograd.Function -------------------------------------------------------


def _window_slices(kernel, stride, out_hw):
    """(k, rows, cols) per window offset: the slice of the padded input that offset reads."""
    (kh, kw), (sh, sw), (oh, ow) = kernel, stride, out_hw
    for p in range(kh):
        for q in range(kw):
            yield p * kw + q, slice(p, p + sh * (oh - 1) + 1, sh), slice(q, q + sw * (ow - 1) + 1, sw)


class MaxPool2dFunction(torch.autograd.Function):
    """Max-pooling as a running maximum over the window offsets; the backward adds each output's
    gradient into the slice position its winner came from. Saves only the window indices."""

    @staticmethod
    def forward(ctx, x, kernel, stride, padding):
        n, c, h, w = x.shape
        (ph, pw) = padding
        out_hw = pool_output_hw(h, w, kernel, stride, padding)
        xpad = x.new_full((n, c, h + 2 * ph, w + 2 * pw), float("-inf"))
        xpad[:, :, ph : ph + h, pw : pw + w] = x
        best = x.new_full((n, c, *out_hw), float("-inf"))
        index = torch.zeros((n, c, *out_hw), dtype=torch.int64, device=x.device)
        first = torch.full_like(index, -1)  # ATen's default winner: the first in-image element
        inside = torch.zeros((h + 2 * ph, w + 2 * pw), dtype=torch.bool, device=x.device)
        inside[ph : ph + h, pw : pw + w] = True
        for k, rows, cols in _window_slices(kernel, stride, out_hw):
            v = xpad[:, :, rows, cols]
            first = torch.where((first < 0) & inside[rows, cols], k, first)
            take = (v > best) | torch.isnan(v)
            best = torch.where(take, v, best)
            index = torch.where(take, k, index)
        # A window of -inf only never "takes": ATen then reports its first element (value -inf).
        index = torch.where(best == float("-inf"), first, index)
        ctx.save_for_backward(index.to(pool_index_dtype(kernel)))
        ctx.geometry = (h, w, kernel, stride, padding)
        return best

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        h, w, kernel, stride, (ph, pw) = ctx.geometry
        n, c, oh, ow = grad.shape
        acc = widen(grad)
        dxpad = acc.new_zeros((n, c, h + 2 * ph, w + 2 * pw))
        for k, rows, cols in _window_slices(kernel, stride, (oh, ow)):
            dxpad[:, :, rows, cols] += torch.where(index == k, acc, 0)
        return dxpad[:, :, ph : ph + h, pw : pw + w].to(grad.dtype), None, None, None


# ---- dispatch --------------------------------------------------------------------------------------


def max_pool2d(x: torch.Tensor, kernel_size, stride=None, padding=0, impl: str = "aten") -> torch.Tensor:
    """2-D max-pooling (no dilation, no ceil_mode) with the chosen implementation; differentiable.

    stride=None means stride = kernel_size, as in F.max_pool2d. OpInputError for a wrong dtype or
    rank, a padding above half the kernel, or a kernel larger than the padded input."""
    check_impl("max_pool2d", impl)
    kernel, stride, pad = check_max_pool2d(x, kernel_size, stride, padding)
    check_device("max_pool2d", impl, x)
    if impl == "aten":
        return F.max_pool2d(x, kernel, stride, pad)
    if impl == "python":
        return MaxPool2dFunction.apply(x, kernel, stride, pad)
    return compiled_rung(impl).max_pool2d(x, kernel, stride, pad)


class MaxPool2d(nn.MaxPool2d):
    """nn.MaxPool2d with our operator in `forward` (no dilation, ceil_mode or return_indices)."""

    def __init__(self, kernel_size, stride=None, padding=0, impl: str = "cpp"):
        super().__init__(kernel_size, stride, padding)
        self.impl = prepare("MaxPool2d", impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return max_pool2d(x, self.kernel_size, self.stride, self.padding, impl=self.impl)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", impl={self.impl!r}"


# ---- check cases (run by ops/check.py) -------------------------------------------------------------


def _pool_case(name, x, kernel, stride, padding, view=None, make=None, edge=False):
    def default_make(batch, gen):
        return {"x": randn64(gen, batch if x[0] is None else x[0], *x[1:])}

    return Case(
        "max_pool2d",
        name,
        make or default_make,
        lambda t, impl: max_pool2d(t["x"], kernel, stride, padding, impl=impl),
        False,
        view,
        edge,
    )


def _pool_edge_values(batch, gen):
    """NaN, +-inf, all--inf windows and exact ties (also across dtypes: small integers)."""
    x = torch.randint(-3, 4, (1, 2, 6, 6), generator=gen).double()
    x[0, 0, 0, 0], x[0, 0, 1, 3], x[0, 1, 2, 2] = math.nan, math.inf, -math.inf
    x[0, 1, 4:6, 0:2] = -math.inf
    return {"x": x}


CASES = [
    _pool_case("lenet-pool1", (None, 6, 28, 28), (2, 2), (2, 2), (0, 0)),
    _pool_case("lenet-pool2", (None, 16, 10, 10), (2, 2), (2, 2), (0, 0)),
    _pool_case("batch1-overlap", (1, 3, 9, 9), (3, 3), (2, 2), (1, 1)),
    _pool_case("non-square", (2, 3, 9, 7), (3, 2), (2, 1), (1, 0)),
    _pool_case("stride1-overlap", (2, 2, 6, 5), (3, 3), (1, 1), (1, 1)),
    _pool_case("strided-input", (2, 4, 12, 20), (2, 2), (2, 2), (0, 0), view=every_other_column),
    _pool_case("nan-inf-ties", None, (2, 2), (2, 2), (0, 0), make=_pool_edge_values, edge=True),
]


def gradcheck_case(g: torch.Generator):
    """float64 inputs small enough for gradcheck's numerical Jacobian, and fn(*inputs, impl)."""
    return (
        (torch.randn(1, 2, 5, 6, dtype=torch.float64, generator=g),),
        lambda x, impl: max_pool2d(x, (3, 2), (2, 1), (1, 1), impl=impl),
    )


OPCHECK_EXTRA = (
    [3, 2],
    [2, 1],
    [1, 1],
)  # the non-tensor arguments of trainlab::max_pool2d_fwd for gradcheck_case's shapes


def _bench_layer(name, c, h, order):
    return Layer(
        name,
        "max_pool2d",
        lambda b, gen: {"x": torch.randn(b, c, h, h, generator=gen)},
        lambda t, impl: max_pool2d(t["x"], 2, impl=impl),
        order,
        steps=("layers", "relu-epilogue"),  # the pools follow the conv layers in both steps
    )


BENCH = [_bench_layer("pool1", 6, 28, 2), _bench_layer("pool2", 16, 10, 6)]  # what `ops bench` times
