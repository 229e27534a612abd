r"""linear (a fully connected layer): one entry point, a ladder of implementations, a Python reference.

    linear(x, weight, bias=None, impl="aten" | "python" | "cpp" | "triton" | "cuda")
    Linear(in_features, out_features, impl="cpp")   # drop-in for nn.Linear (2-D inputs)

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

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainlab.ops.layer_args import check_device, check_impl, check_linear
from trainlab.ops.rungs import compiled_rung, prepare

REDUCED = (torch.bfloat16, torch.float16)


class LinearFunction(torch.autograd.Function):
    """The three products above, bfloat16/float16 computed in float32 and rounded once."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        y = _widen(x) @ _widen(weight).t()
        if bias is not None:
            y = y + _widen(bias)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = _widen(grad)
        dx = (g @ _widen(weight)).to(x.dtype) if ctx.needs_input_grad[0] else None
        dw = (g.t() @ _widen(x)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        db = g.sum(0).to(weight.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def _widen(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in REDUCED else t


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


class Linear(nn.Linear):
    """nn.Linear with our operator in `forward`: same parameters, initialization and state_dict keys."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, impl: str = "cpp"):
        super().__init__(in_features, out_features, bias=bias)
        self.impl = prepare("Linear", impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, impl=self.impl)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", impl={self.impl!r}"
