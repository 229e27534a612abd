"""The LeNet-5 a run built, as a table: layer, output shape, parameters.

Read off the model itself (built on the CPU from the run's config, one forward pass of a blank image),
so the table cannot disagree with the code. A training run records it in summary.json (`architecture`)
and the report reads it from there: the report reads files, it never builds a workload's model.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from trainlab.errors import ConfigError
from trainlab.lenet.model import LeNet5

HEADER = ["layer", "output (C×H×W)", "parameters"]


def _describe(m: nn.Module, act: str) -> str:
    if isinstance(m, nn.Conv2d):
        pad = f", padding {m.padding[0]}" if m.padding[0] else ""
        return f"convolution {m.in_channels}→{m.out_channels}, {m.kernel_size[0]}×{m.kernel_size[1]}{pad}"
    if isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
        k = m.kernel_size if isinstance(m.kernel_size, int) else m.kernel_size[0]
        return f"{'max' if isinstance(m, nn.MaxPool2d) else 'average'} pooling {k}×{k}"
    if isinstance(m, nn.Linear):
        return f"fully connected {m.in_features}→{m.out_features}"
    if isinstance(m, nn.Flatten):
        return "flatten"
    if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
        return "batch normalization"
    return act  # the activation


def architecture_rows(config: dict) -> list[list[str]] | None:
    """The table (header first) for a run's config; None for another model or a config this version
    cannot build (no table, never a broken run)."""
    if config.get("model", "lenet5") != "lenet5":
        return None
    act = str(config.get("act", "relu"))
    try:  # shapes and parameters do not depend on whose GELU or whose layers: build PyTorch's
        model = LeNet5(
            act="relu",
            pool=config.get("pool", "max"),
            batchnorm=bool(config.get("batchnorm")),
            batchnorm_conv1=bool(config.get("batchnorm_conv1", True)),
        )
    except (ConfigError, ValueError, TypeError):
        return None
    rows = [HEADER, ["input: a 28×28 grey image", "1×28×28", "0"]]

    def hook(m, _inp, out):
        rows.append(
            [_describe(m, act), "×".join(str(d) for d in out.shape[1:]), f"{sum(p.numel() for p in m.parameters()):,}"]
        )

    leaves = [m for m in model.modules() if not list(m.children()) and not isinstance(m, nn.Identity)]
    handles = [m.register_forward_hook(hook) for m in leaves]
    with torch.no_grad():  # eval: batch norm cannot take a batch of one image in training mode
        model.eval()(torch.zeros(1, 1, 28, 28))
    for h in handles:
        h.remove()
    rows.append(["total", "10 class scores", f"{sum(p.numel() for p in model.parameters()):,}"])
    return rows
