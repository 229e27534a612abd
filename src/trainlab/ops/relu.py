r"""relu: one entry point, a ladder of implementations — the activation of an all-ours LeNet-5.

    relu(x, impl="aten" | "python" | "cpp" | "triton" | "cuda");   ReLU(impl="cpp")

    y = max(x, 0),    dx = dy where y > 0, else 0

NaN is kept (relu(NaN) = NaN) and its gradient passes, exactly as ATen's relu and
threshold_backward(dy, y, 0) do. Like ATen, the backward reads the output y, not the input x —
y is what the next layer keeps alive anyway, so saving it costs no memory.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainlab.ops.layer_args import check_device, check_impl, check_relu
from trainlab.ops.rungs import compiled_rung, prepare


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
