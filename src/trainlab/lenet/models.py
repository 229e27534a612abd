"""`--model`: the architectures the lab's reports compare, from a linear classifier to ResNet-18.

- `linear`: one fully connected layer, 784 → 10 (multinomial logistic regression): 7,850 parameters.
- `mlp`: 784 → 300 → 100 → 10, the fully connected net of LeCun et al. (1998, "300-100"): 266,610.
- `one-conv`: one conv layer (8@5×5, pad 2) → pool → FC 128 → FC 10, the second report's
  "simple_conv" (one conv, two linear layers): 202,330.
- `lenet5` (default) and `lenet5-bn` (BatchNorm after the convs and hidden FCs): `lenet.model.LeNet5`.
- `resnet18`: ResNet-18 in its CIFAR form (He et al. 2016 §4.2 style stem, as in the notes' multi-GPU
  experiment): a 3×3 stride-1 stem and no max-pool, because a 7×7/2 stem + pool would shrink a 28×28
  image to 7×7 before the first block; four stages of two BasicBlocks (64, 128, 256, 512 channels),
  global average pool, FC 10. With 1 input channel: 11,172,810 parameters.

`--act` sets every hidden activation of every model (ResNet-18's included), `--pool` the pooling
of lenet5 and one-conv; --batchnorm and --ops are LeNet-5's own flags.
`flops_per_image` counts the forward pass's multiply-adds ×2 of every conv and linear layer, the
convention of `torch.utils.flop_counter` (tests compare the two); a training step costs about 3×.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from trainlab.errors import ConfigError
from trainlab.lenet.activations import make_activation
from trainlab.lenet.model import POOLS, LeNet5

MODELS = ("linear", "mlp", "one-conv", "lenet5", "lenet5-bn", "resnet18")
LENET_MODELS = ("lenet5", "lenet5-bn")
IMAGE_SHAPE = (1, 28, 28)


def _check_input(name: str, x: torch.Tensor) -> None:
    if x.dim() != 4 or tuple(x.shape[1:]) != IMAGE_SHAPE:
        raise ValueError(f"{name} expects input of shape [B, 1, 28, 28], got {list(x.shape)}")


class Linear(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("linear", x)
        return self.classifier(x)


class MLP(nn.Module):
    def __init__(self, act: str = "relu", hidden: tuple[int, ...] = (300, 100), num_classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = 28 * 28
        for h in hidden:
            layers += [nn.Linear(width, h), make_activation(act)]
            width = h
        self.classifier = nn.Sequential(*layers, nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("mlp", x)
        return self.classifier(x)


class OneConv(nn.Module):
    def __init__(
        self, act: str = "relu", pool: str = "max", channels: int = 8, hidden: int = 128, num_classes: int = 10
    ):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 5, padding=2), make_activation(act), POOLS[pool](2)
        )  # 28→28→14
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(channels * 14 * 14, hidden), make_activation(act), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("one-conv", x)
        return self.classifier(self.features(x))

    @property
    def conv1(self) -> nn.Conv2d:
        return self.features[0]

    def first_layer_maps(self, x: torch.Tensor) -> torch.Tensor:
        return self.features[:2](x)


class BasicBlock(nn.Module):
    """Two 3×3 convs with BatchNorm; a 1×1/stride-2 projection on the shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int, act: str):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.act1, self.act2 = make_activation(act), make_activation(act)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.conv1(x)))
        return self.act2(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18, CIFAR form: 3×3 stem, no max-pool, 1 input channel (28×28 → 28, 14, 7, 4 per stage)."""

    def __init__(self, act: str = "relu", num_classes: int = 10, in_channels: int = 1):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), make_activation(act)
        )
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [BasicBlock(cin, cout, stride, act), BasicBlock(cout, cout, 1, act)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        # the last stage's map is 4×4 for the 28×28 input forward() insists on: AvgPool2d(4) is the global pool
        self.head = nn.Sequential(nn.AvgPool2d(4), nn.Flatten(), nn.Linear(512, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input("resnet18", x)
        return self.head(self.blocks(self.stem(x)))

    @property
    def conv1(self) -> nn.Conv2d:
        return self.stem[0]

    def first_layer_maps(self, x: torch.Tensor) -> torch.Tensor:
        return self.stem(x)


def check_model_choice(model: str, batchnorm: bool, ops: str, pool: str) -> None:
    """The --model flag against the LeNet-only flags (before any data loads)."""
    if model not in MODELS:
        raise ConfigError(f"--model {model!r}: expected one of {', '.join(MODELS)}")
    if model in LENET_MODELS:
        return
    if batchnorm:
        raise ConfigError(
            f"--batchnorm is a LeNet-5 option; --model {model} "
            + ("has its own BatchNorm" if model == "resnet18" else "has none (use --model lenet5-bn)")
            + " (the `best` preset turns --batchnorm on)"
        )
    if ops not in ("aten", "auto"):
        raise ConfigError(f"--ops {ops}: our operators build LeNet-5 only; use --model lenet5 (got --model {model})")
    if pool != "max" and model != "one-conv":
        raise ConfigError(f"--pool {pool}: --model {model} has no pooling layer to choose (lenet5, one-conv)")


def make_model(
    model: str = "lenet5",
    act: str = "relu",
    pool: str = "max",
    batchnorm: bool = False,
    ops: str = "aten",
    batchnorm_conv1: bool = True,
) -> nn.Module:
    """The network `--model` names, built with the run's --act/--pool (and LeNet-5's --batchnorm/--ops)."""
    check_model_choice(model, batchnorm, ops, pool)
    if model in LENET_MODELS:
        return LeNet5(
            act=act, pool=pool, batchnorm=batchnorm or model == "lenet5-bn", ops=ops, batchnorm_conv1=batchnorm_conv1
        )
    if model == "linear":
        return Linear()
    if model == "mlp":
        return MLP(act=act)
    if model == "one-conv":
        return OneConv(act=act, pool=pool)
    return ResNet18(act=act)


def flops_per_image(model: nn.Module) -> int:
    """Forward FLOPs of one 1×28×28 image: 2 × multiply-adds of every Conv2d and Linear, counted from
    the layers' shapes as a probe image passes (BatchNorm, activations, pooling and adds not counted,
    as in torch.utils.flop_counter)."""
    total = 0

    def count(module, inputs, output):
        nonlocal total
        if isinstance(module, nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels // module.groups
            total += 2 * k * output[0].numel()  # each output value: k multiply-adds
        elif isinstance(module, nn.Linear):
            total += 2 * module.in_features * module.out_features

    param = next(model.parameters())
    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    was_training = model.training
    try:
        model.eval()  # the probe must not move BatchNorm's running statistics
        with torch.no_grad():
            model(torch.zeros(1, *IMAGE_SHAPE, device=param.device, dtype=param.dtype))
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return total
