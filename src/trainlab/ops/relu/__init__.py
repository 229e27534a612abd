r"""relu: one entry point, a ladder of implementations — the activation of an all-ours LeNet-5.

    relu(x, impl="aten" | "python" | "cpp" | "triton" | "cuda");   ReLU(impl="cpp")

    y = max(x, 0),    dx = dy where y > 0, else 0

NaN is kept (relu(NaN) = NaN) and its gradient passes, exactly as ATen's relu and
threshold_backward(dy, y, 0) do. Like ATen, the backward reads the output y, not the input x —
y is what the next layer keeps alive anyway, so saving it costs no memory.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainlab.ops.ladder import Case, Layer, check_impl, every_other_column, randn64
from trainlab.ops.layers.layer_args import check_device, check_relu
from trainlab.ops.layers.layers_cpp import compiled_rung, prepare


class ReluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.where(torch.isnan(x) | (x > 0), x, torch.zeros((), dtype=x.dtype, device=x.device))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return torch.where(y <= 0, torch.zeros((), dtype=grad.dtype, device=grad.device), grad)


def relu(x: torch.Tensor, impl: str = "aten") -> torch.Tensor:
    check_impl("relu", impl)
    check_relu(x)
    check_device("relu", impl, x)
    if impl == "aten":
        return F.relu(x)
    if impl == "python":
        return ReluFunction.apply(x)
    return compiled_rung(impl).relu(x)


class ReLU(nn.Module):
    def __init__(self, impl: str = "cpp"):
        super().__init__()
        self.impl = prepare("ReLU", impl)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu(x, impl=self.impl)

    def extra_repr(self) -> str:
        return f"impl={self.impl!r}"


# ---- check cases (run by ops/check.py) -------------------------------------------------------------


def _relu_case(name, shape, view=None, make=None, edge=False):
    def default_make(batch, gen):
        return {"x": randn64(gen, batch if shape[0] is None else shape[0], *shape[1:])}

    return Case("relu", name, make or default_make, lambda t, impl: relu(t["x"], impl=impl), False, view, edge)


def _relu_edge_values(batch, gen):
    vals = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 1e-40, -1e-40, 3.5, -2.25, 1e30]
    return {"x": torch.tensor(vals, dtype=torch.float64).view(3, 4)}


CASES = [
    _relu_case("lenet-act1", (None, 6, 28, 28)),
    _relu_case("strided-input", (3, 4, 5, 8), view=every_other_column),
    _relu_case("nan-inf-zero", None, make=_relu_edge_values, edge=True),
]


def gradcheck_case(g: torch.Generator):
    """float64 inputs small enough for gradcheck's numerical Jacobian, and fn(*inputs, impl)."""
    return ((torch.randn(4, 6, dtype=torch.float64, generator=g),), lambda x, impl: relu(x, impl=impl))


OPCHECK_EXTRA = ()  # the non-tensor arguments of trainlab::relu_fwd for gradcheck_case's shapes


def _bench_layer(name, order, *shape):
    return Layer(
        name,
        "relu",
        lambda b, gen: {"x": torch.randn(b, *shape, generator=gen)},
        lambda t, impl: relu(t["x"], impl=impl),
        order,
    )


BENCH = [
    _bench_layer("relu1", 1, 6, 28, 28),
    _bench_layer("relu2", 5, 16, 10, 10),
    _bench_layer("relu3", 8, 120),
    _bench_layer("relu4", 10, 84),
]  # what `ops bench` times: LeNet-5's activations
