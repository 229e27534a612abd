r"""conv2d (stride 1, zero padding): one entry point, a ladder of implementations, a Python reference.

    conv2d(x, weight, bias=None, padding=0, impl="aten" | "python" | "cpp" | "triton" | "cuda")
    Conv2d(in_channels, out_channels, kernel_size, padding=0, impl="cpp")   # drop-in for nn.Conv2d
    conv2d_relu(...), Conv2dReLU(...)   relu(conv2d(...)): one kernel on the triton rung

Math, for x [N, C, H, W], W [OC, C, KH, KW], padding P, output [N, OC, OH, OW] with
OH = H + 2P - KH + 1:

    y[n, o, i, j] = b[o] + sum_{c, p, q} W[o, c, p, q] * xpad[n, c, i + p, j + q]

im2col turns this into one matrix product per sample: cols(x)[(c, p, q), (i, j)] =
xpad[c, i + p, j + q] is a [C*KH*KW, OH*OW] matrix and y[n] = W.view(OC, -1) @ cols(x[n]) + b.
Differentiating that product (the backward, derived once here and implemented by every rung):

    dW = sum_n dy[n] @ cols(x[n])^T          (a GEMM with the sample-and-pixel axis contracted)
    db = sum_{n, i, j} dy[n, :, i, j]
    dx = col2im(W^T @ dy[n])                 col2im is im2col's adjoint: every entry of the
                                             [C*KH*KW, OH*OW] matrix is added back to the input
                                             position it was copied from (overlapping patches add up)

The `python` rung writes im2col and col2im as loops over the KH*KW kernel offsets, each one slice
of the padded input (25 slices for LeNet's 5x5 kernels): readable, and vectorized over batch,
channels and pixels by torch. The `cpp` rung (ops/layers/layers_cpu.cpp) does the same data movement in
cache-sized chunks with one BLAS GEMM per chunk; `triton` fuses im2col into the GEMM (implicit
GEMM: patches are gathered straight into registers, never materialized); `cuda` is the C++ op's
CUDA kernels (csrc/layers_cuda.cu: direct implicit-GEMM kernels, the input gradient as the same
kernel on flipped weights, a deterministic two-stage weight-gradient reduction).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainlab.ops.ladder import RELU_EPILOGUE_IMPLS, Case, Layer, check_impl, every_other_column, randn64, widen
from trainlab.ops.layers.layer_args import check_conv2d, check_device, conv2d_output_hw
from trainlab.ops.layers.layers_cpp import compiled_rung, prepare
from trainlab.ops.relu import relu

# ---- python: the reference autograd.Function -------------------------------------------------------


def im2col(x: torch.Tensor, kh: int, kw: int, padding: tuple[int, int]) -> torch.Tensor:
    """[N, C, H, W] -> [N, C*KH*KW, OH*OW]: one strided slice of the padded input per kernel offset."""
    n, c, h, w = x.shape
    ph, pw = padding
    xpad = x.new_zeros((n, c, h + 2 * ph, w + 2 * pw))
    xpad[:, :, ph : ph + h, pw : pw + w] = x
    oh, ow = conv2d_output_hw(h, w, kh, kw, padding)
    cols = x.new_empty((n, c, kh, kw, oh, ow))
    for p in range(kh):
        for q in range(kw):
            cols[:, :, p, q] = xpad[:, :, p : p + oh, q : q + ow]
    return cols.reshape(n, c * kh * kw, oh * ow)


def col2im(cols: torch.Tensor, c: int, h: int, w: int, kh: int, kw: int, padding: tuple[int, int]) -> torch.Tensor:
    """The adjoint of im2col: [N, C*KH*KW, OH*OW] -> [N, C, H, W], overlapping patches summed."""
    n = cols.shape[0]
    ph, pw = padding
    oh, ow = conv2d_output_hw(h, w, kh, kw, padding)
    cols = cols.reshape(n, c, kh, kw, oh, ow)
    xpad = cols.new_zeros((n, c, h + 2 * ph, w + 2 * pw))
    for p in range(kh):
        for q in range(kw):
            xpad[:, :, p : p + oh, q : q + ow] += cols[:, :, p, q]
    return xpad[:, :, ph : ph + h, pw : pw + w]


class Conv2dFunction(torch.autograd.Function):
    """conv2d as im2col + matmul, with the backward derived in the module docstring. Saves x and W
    (not the columns: they are KH*KW times larger than x and cheap to rebuild). bfloat16/float16
    inputs are computed in float32 and rounded once, as ATen does."""

    @staticmethod
    def forward(ctx, x, weight, bias, padding):
        ctx.save_for_backward(x, weight)
        ctx.padding, ctx.has_bias = padding, bias is not None
        xc, wc = widen(x), widen(weight)
        oc, _, kh, kw = weight.shape
        cols = im2col(xc, kh, kw, padding)  # [N, CKK, L]
        y = wc.reshape(oc, -1) @ cols  # [N, OC, L]   (torch.matmul: BLAS)
        if bias is not None:
            y = y + widen(bias).view(1, oc, 1)
        oh, ow = conv2d_output_hw(x.shape[2], x.shape[3], kh, kw, padding)
        return y.reshape(x.shape[0], oc, oh, ow).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        xc, wc, g = widen(x), widen(weight), widen(grad)
        n, c, h, w = x.shape
        oc, _, kh, kw = weight.shape
        gm = g.reshape(n, oc, -1)  # [N, OC, L]
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = col2im(wc.reshape(oc, -1).t() @ gm, c, h, w, kh, kw, ctx.padding).to(x.dtype)
        if ctx.needs_input_grad[1]:
            cols = im2col(xc, kh, kw, ctx.padding)
            dw = (gm @ cols.transpose(1, 2)).sum(0).reshape(weight.shape).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = gm.sum((0, 2)).to(weight.dtype)
        return dx, dw, db, None


# ---- dispatch --------------------------------------------------------------------------------------


def conv2d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, padding=0, impl: str = "aten"
) -> torch.Tensor:
    """2-D convolution, stride 1, zero padding, with the chosen implementation; differentiable.

    OpInputError (one line) for a wrong dtype, rank, channel count or a kernel larger than the
    padded input; ConfigError for an unknown impl; HardwareError when the impl cannot run here."""
    check_impl("conv2d", impl)
    pad = check_conv2d(x, weight, bias, padding)
    check_device("conv2d", impl, x)
    if impl == "aten":
        return F.conv2d(x, weight, bias, padding=pad)
    if impl == "python":
        return Conv2dFunction.apply(x, weight, bias, pad)
    return compiled_rung(impl).conv2d(x, weight, bias, pad)


def conv2d_relu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, padding=0, impl: str = "aten"
) -> torch.Tensor:
    """relu(conv2d(x, weight, bias, padding)): on the triton rung one forward kernel (the ReLU in the
    GEMM's epilogue; the backward masks dy once, then runs the conv's GEMMs), elsewhere two ops."""
    if impl not in RELU_EPILOGUE_IMPLS:
        return relu(conv2d(x, weight, bias, padding, impl=impl), impl=impl)
    pad = check_conv2d(x, weight, bias, padding)
    return compiled_rung(impl).conv2d_relu(x, weight, bias, pad)


class Conv2d(nn.Conv2d):
    """nn.Conv2d with our operator in `forward`: same parameters, same initialization (so the same
    seed gives the same weights as nn.Conv2d), same state_dict keys. Stride 1, no dilation/groups."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size, padding=0, bias: bool = True, impl: str = "cpp"
    ):
        check_impl(type(self).__name__, impl)  # before nn.Conv2d draws its initial weights
        super().__init__(in_channels, out_channels, kernel_size, padding=padding, bias=bias)
        self.impl = prepare(type(self).__name__, impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv2d(x, self.weight, self.bias, self.padding, impl=self.impl)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", impl={self.impl!r}"


class Conv2dReLU(Conv2d):
    """Conv2d followed by ReLU, as one layer (conv2d_relu): Conv2d's parameters, draws and keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv2d_relu(x, self.weight, self.bias, self.padding, impl=self.impl)


# ---- check cases (run by ops/check.py) -------------------------------------------------------------


def random_conv_inputs(x, w, bias=True):
    """A case's make(batch, gen): float64 x of shape `x` (None: the check's batch), weights of shape `w`
    scaled to keep outputs near unit size, and a bias (conv_relu_pool2d's cases use it too)."""

    def make(batch, gen):
        n = batch if x[0] is None else x[0]
        return {
            "x": randn64(gen, n, *x[1:]),
            "weight": randn64(gen, *w) / math.sqrt(w[1] * w[2] * w[3]),
            "bias": randn64(gen, w[0]) if bias else None,
        }

    return make


def _conv_case(name, x, w, padding, bias=True, view=None, op=None):
    op = op or conv2d
    return Case(
        "conv2d",
        name,
        random_conv_inputs(x, w, bias),
        lambda t, impl: op(t["x"], t["weight"], t["bias"], padding, impl=impl),
        True,
        view,
    )


CASES = [
    _conv_case("lenet-conv1", (None, 1, 28, 28), (6, 1, 5, 5), (2, 2)),
    _conv_case("lenet-conv2", (None, 6, 14, 14), (16, 6, 5, 5), (0, 0)),
    _conv_case("batch1", (1, 3, 9, 9), (4, 3, 3, 3), (1, 1)),
    _conv_case("non-square", (2, 2, 7, 12), (3, 2, 3, 5), (1, 2)),
    _conv_case("strided-input", (2, 3, 10, 22), (4, 3, 3, 3), (0, 0), bias=False, view=every_other_column),
    _conv_case("relu-epilogue", (2, 3, 9, 8), (4, 3, 3, 3), (1, 1), op=conv2d_relu),  # conv2d_relu, both ways
]


def gradcheck_inputs(g: torch.Generator, x_shape: tuple[int, ...]):
    """float64 x of `x_shape` (2 channels), a 3x2 kernel to 3 channels and its bias: small enough for
    gradcheck's numerical Jacobian (conv_relu_pool2d's gradcheck case uses them too)."""
    return randn64(g, *x_shape), randn64(g, 3, 2, 3, 2), randn64(g, 3)


def gradcheck_case(g: torch.Generator):
    """float64 inputs small enough for gradcheck's numerical Jacobian, and fn(*inputs, impl)."""
    return gradcheck_inputs(g, (1, 2, 5, 4)), lambda x, w, b, impl: conv2d(x, w, b, (1, 0), impl=impl)


OPCHECK_EXTRA = ([1, 0],)  # the non-tensor arguments of trainlab::conv2d_fwd for gradcheck_case's shapes


# ---- what `ops bench` times: LeNet-5's convolutions at their real shapes ----------------------------


def bench_layer(name, c, h, oc, pad, order, first=False, relu_epilogue=False):
    """LeNet's conv layer `name` (5x5 kernels); relu_epilogue: conv2d_relu, the layer and its ReLU."""
    op = conv2d_relu if relu_epilogue else conv2d

    def inputs(b, gen):
        return {
            "x": torch.randn(b, c, h, h, generator=gen),
            "weight": torch.randn(oc, c, 5, 5, generator=gen) * 0.2,
            "bias": torch.randn(oc, generator=gen),
        }

    return Layer(
        name,
        "conv2d",
        inputs,
        lambda t, impl: op(t["x"], t["weight"], t["bias"], pad, impl=impl),
        order,
        input_needs_grad=not first,
        steps=("relu-epilogue",) if relu_epilogue else ("layers",),
    )


BENCH = [
    bench_layer("conv1", 1, 28, 6, 2, 0, first=True),
    bench_layer("conv1+relu", 1, 28, 6, 2, 1.5, first=True, relu_epilogue=True),
    bench_layer("conv2", 6, 14, 16, 0, 4),
    bench_layer("conv2+relu", 6, 14, 16, 0, 5.5, relu_epilogue=True),
]
