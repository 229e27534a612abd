r"""linear (a fully connected layer): one entry point, a ladder of implementations, a Python reference.

    linear(x, weight, bias=None, impl="aten" | "python" | "cpp" | "triton" | "cuda")
    Linear(in_features, out_features, impl="cpp")   # drop-in for nn.Linear (2-D inputs)
    linear_relu(...), LinearReLU(...)                # relu(linear(...)): one kernel on the triton rung

    y = x W^T + b                 x [N, in], W [out, in], y [N, out]
    dx = dy W,   dW = dy^T x,     db = sum_n dy[n]

(each follows from y[n, o] = sum_i x[n, i] W[o, i] + b[o] by differentiating one factor at a
time). All three products are GEMMs; for `python` and `cpp` they are ATen's BLAS calls (torch.matmul,
at::addmm/at::mm), so the only data movement that is ours is the bias-gradient column sum — this
operator is on the ladder so that LeNet-5 can be built from our operators alone, and so that
`triton` can show a hand-written tiled GEMM (`tl.dot`) with the bias fused into its epilogue and
the bias gradient fused into the weight-gradient GEMM.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainlab.ops.ladder import RELU_EPILOGUE_IMPLS, Case, Layer, check_impl, randn64, widen
from trainlab.ops.layers.layer_args import check_device, check_linear
from trainlab.ops.layers.layers_cpp import compiled_rung, prepare
from trainlab.ops.relu import relu


class LinearFunction(torch.autograd.Function):
    """The three products above, bfloat16/float16 computed in float32 and rounded once."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        y = widen(x) @ widen(weight).t()
        if bias is not None:
            y = y + widen(bias)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = widen(grad)
        dx = (g @ widen(weight)).to(x.dtype) if ctx.needs_input_grad[0] else None
        dw = (g.t() @ widen(x)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        db = g.sum(0).to(weight.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, impl: str = "aten") -> torch.Tensor:
    """y = x W^T + b for 2-D x with the chosen implementation; differentiable.

    OpInputError for a wrong dtype or rank (x must be [N, in_features]) or a feature mismatch."""
    check_impl("linear", impl)
    check_linear(x, weight, bias)
    check_device("linear", impl, x)
    if impl == "aten":
        return F.linear(x, weight, bias)
    if impl == "python":
        return LinearFunction.apply(x, weight, bias)
    return compiled_rung(impl).linear(x, weight, bias)


def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, impl: str = "aten"):
    """relu(linear(x, weight, bias)): on the triton rung one kernel each way (as conv2d_relu)."""
    if impl not in RELU_EPILOGUE_IMPLS:
        return relu(linear(x, weight, bias, impl=impl), impl=impl)
    check_linear(x, weight, bias)
    return compiled_rung(impl).linear_relu(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear with our operator in `forward`: same parameters, initialization and state_dict keys."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, impl: str = "cpp"):
        super().__init__(in_features, out_features, bias=bias)
        self.impl = prepare("Linear", impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, impl=self.impl)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", impl={self.impl!r}"


class LinearReLU(Linear):
    """Linear followed by ReLU, as one layer (linear_relu): Linear's parameters, draws and keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_relu(x, self.weight, self.bias, impl=self.impl)


# ---- check cases (run by ops/check.py) -------------------------------------------------------------


def _linear_case(name, n, fin, fout, bias=True, transposed=False, op=None):
    op = op or linear

    def make(batch, gen):
        rows = batch if n is None else n
        x = randn64(gen, fin, rows) if transposed else randn64(gen, rows, fin)
        return {
            "x": x,
            "weight": randn64(gen, fout, fin) / math.sqrt(fin),
            "bias": randn64(gen, fout) if bias else None,
        }

    return Case(
        "linear",
        name,
        make,
        lambda t, impl: op(t["x"], t["weight"], t["bias"], impl=impl),
        True,
        _transposed if transposed else None,
    )


def _transposed(t):
    return {**t, "x": t["x"].t()}


CASES = [
    _linear_case("lenet-fc1", None, 400, 120),
    _linear_case("lenet-fc2", None, 120, 84),
    _linear_case("lenet-fc3", None, 84, 10),
    _linear_case("batch1", 1, 30, 7),
    _linear_case("transposed-input", 9, 25, 6, bias=False, transposed=True),  # x: a [25, 9] tensor's .t()
    _linear_case("relu-epilogue", 6, 25, 7, op=linear_relu),  # linear_relu, forward and backward
]


def gradcheck_case(g: torch.Generator):
    """float64 inputs small enough for gradcheck's numerical Jacobian, and fn(*inputs, impl)."""
    return (
        (
            torch.randn(3, 5, dtype=torch.float64, generator=g),
            torch.randn(4, 5, dtype=torch.float64, generator=g),
            torch.randn(4, dtype=torch.float64, generator=g),
        ),
        lambda x, w, b, impl: linear(x, w, b, impl=impl),
    )


OPCHECK_EXTRA = ()  # the non-tensor arguments of trainlab::linear_fwd for gradcheck_case's shapes


def _bench_layer(name, fin, fout, order, steps=("layers",)):
    op = linear_relu if steps == ("relu-epilogue",) else linear

    def inputs(b, gen):
        return {
            "x": torch.randn(b, fin, generator=gen),
            "weight": torch.randn(fout, fin, generator=gen) * 0.05,
            "bias": torch.randn(fout, generator=gen),
        }

    return Layer(
        name, "linear", inputs, lambda t, impl: op(t["x"], t["weight"], t["bias"], impl=impl), order, True, steps
    )


BENCH = [
    _bench_layer("fc1", 400, 120, 7),
    _bench_layer("fc1+relu", 400, 120, 8.5, ("relu-epilogue",)),
    _bench_layer("fc2", 120, 84, 9),
    _bench_layer("fc2+relu", 120, 84, 10.5, ("relu-epilogue",)),
    _bench_layer("fc3", 84, 10, 11, ("layers", "relu-epilogue")),  # no ReLU after it: in both steps
]
