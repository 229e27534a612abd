"""`--sync-bn`: BatchNorm over the global batch under data parallelism, not over each rank's shard.

Under DDP each rank normalizes its own shard with its own mean and variance, so a BatchNorm model
trained on W ranks is a different computation from one process on the same global batches
(docs/beyond-lenet.md). Synchronized BatchNorm all-reduces, per layer and per step, each channel's
Σx, Σx² and the row count, and normalizes every shard with the global batch's statistics; the
all-reduce is differentiable (`_AllReduceSum`: its backward all-reduces the incoming gradients), so backward sees the cross-rank terms too and the averaged gradient is the
global batch's. With it a W-rank run equals one process (tests/test_lenet_ta_rows.py).

PyTorch's `nn.SyncBatchNorm` is the same idea with fused kernels, but it refuses CPU tensors ("expected
input tensor to be on GPU"), and this course's multi-process runs are mostly gloo on CPU processes;
this module is written out so that one implementation runs, and is tested, on both devices. The
statistics are computed in float32 whatever autocast hands in; evaluation (`.eval()`) and a world of
one take BatchNorm's own path, with the running statistics updated as torch does (unbiased variance).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn


class _AllReduceSum(torch.autograd.Function):
    """Σ over ranks, differentiable: y = Σ_r x_r for every rank, so ∂L/∂x_r = Σ_r' ∂L_r'/∂y."""

    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        g = grad.clone()
        dist.all_reduce(g)
        return g


class GlobalBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm1d/2d whose training statistics are the global batch's (all ranks of the default group)."""

    def _check_input_dim(self, x):
        if x.dim() not in (2, 3, 4):
            raise ValueError(f"GlobalBatchNorm: expected a 2-D to 4-D input, got {x.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        c = x.shape[1]
        dims = [0, *range(2, x.dim())]
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # 16-bit statistics in float32
        local = torch.cat([xf.sum(dims), (xf * xf).sum(dims), xf.new_tensor([xf.numel() / c])])
        total = _AllReduceSum.apply(local)
        n = total[2 * c]
        mean = total[:c] / n
        var = (total[c : 2 * c] / n - mean * mean).clamp_min(0)  # biased, as BatchNorm normalizes with
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), m)
                unbiased = var.detach() * (n.detach() / (n.detach() - 1).clamp_min(1))
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), m)
        shape = [1, c] + [1] * (x.dim() - 2)
        y = (xf - mean.view(shape)) * (var.view(shape) + self.eps).rsqrt()
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)  # elementwise from x: channels-last in, channels-last out


def convert_sync_batchnorm(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm1d/2d in `model` (in place; `model` itself returned) by a GlobalBatchNorm
    holding the same parameter and buffer objects, so an optimizer or EMA built before still updates them."""
    for name, child in model.named_children():
        if isinstance(child, (nn.BatchNorm1d, nn.BatchNorm2d)) and not isinstance(child, GlobalBatchNorm):
            g = GlobalBatchNorm(child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats)
            g.weight, g.bias = child.weight, child.bias
            g.running_mean, g.running_var, g.num_batches_tracked = (
                child.running_mean,
                child.running_var,
                child.num_batches_tracked,
            )
            g.train(child.training)
            setattr(model, name, g)
        else:
            convert_sync_batchnorm(child)
    return model
