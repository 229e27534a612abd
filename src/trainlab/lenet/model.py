"""LeNet-5 (LeCun et al., 1998) in its common modern form.

conv 6@5×5 (pad 2) → pool → conv 16@5×5 → pool → FC 120 → FC 84 → FC 10: 61,706 parameters.
The activation is chosen by name from `models.activations` (relu, gelu, the trainlab GELU
implementations…); pooling is max or average; `batchnorm=True` adds BatchNorm after each conv and
hidden FC layer (the high-accuracy preset). `batchnorm_conv1=False` leaves conv1's output
unnormalized: on a CPU that BatchNorm (6 channels × 28 × 28 per image, the largest activation) is the
costliest one, and channels-last, which speeds up the convolutions, slows it down.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from trainlab.errors import ConfigError
from trainlab.lenet.activations import make_activation

POOLS = {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}


class LeNet5(nn.Module):
    def __init__(self, act: str = "relu", pool: str = "max", batchnorm: bool = False, num_classes: int = 10,
                 batchnorm_conv1: bool = True):
        super().__init__()
        if pool not in POOLS:
            raise ConfigError(f"--pool {pool!r}: expected one of {', '.join(POOLS)}")
        Pool = POOLS[pool]
        norm2d = (lambda c: nn.BatchNorm2d(c)) if batchnorm else (lambda c: nn.Identity())
        norm1d = (lambda c: nn.BatchNorm1d(c)) if batchnorm else (lambda c: nn.Identity())
        bn1 = batchnorm and batchnorm_conv1
        # Conv biases are redundant before BatchNorm (it has its own shift).
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2, bias=not bn1), norm2d(6) if bn1 else nn.Identity(),             # 28→28
            make_activation(act), Pool(2),                                                                  # 28→14
            nn.Conv2d(6, 16, 5, bias=not batchnorm), norm2d(16), make_activation(act), Pool(2),             # 14→10→5
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120, bias=not batchnorm), norm1d(120), make_activation(act),
            nn.Linear(120, 84, bias=not batchnorm), norm1d(84), make_activation(act),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1:] != (1, 28, 28):
            raise ValueError(f"LeNet5 expects input of shape [B, 1, 28, 28], got {list(x.shape)}")
        return self.classifier(self.features(x))

    @property
    def conv1(self) -> nn.Conv2d:
        return self.features[0]

    def first_layer_maps(self, x: torch.Tensor) -> torch.Tensor:
        """Activations after the first conv block (for 'visualize intermediate layers')."""
        return self.features[:3](x)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
