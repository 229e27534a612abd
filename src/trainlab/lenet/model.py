"""LeNet-5 (LeCun et al., 1998) in its common modern form.

conv 6@5×5 (pad 2) → pool → conv 16@5×5 → pool → FC 120 → FC 84 → FC 10: 61,706 parameters.
The activation is chosen by name from `models.activations` (relu, gelu, the trainlab GELU
implementations…); pooling is max or average; `batchnorm=True` adds BatchNorm after each conv and
hidden FC layer (the high-accuracy preset). `batchnorm_conv1=False` leaves conv1's output
unnormalized: on a CPU that BatchNorm (6 channels × 28 × 28 per image, the largest activation) is the
costliest one, and channels-last, which speeds up the convolutions, slows it down (the `fast` preset).

`ops="own[=python|cpp|triton|cuda]"` builds the same network from our operators (trainlab.ops:
Conv2d, MaxPool2d, Linear and ReLU/GELU at the chosen rung; BatchNorm, when asked for, stays
PyTorch's). Our layer classes subclass nn.Conv2d / nn.Linear, so they draw the same initial weights
from the same seed and have the same state_dict keys: an `own` run starts from exactly the weights
of the `aten` run (flatten stays a view, the loss stays F.cross_entropy). On a rung whose conv and
linear layers take the ReLU into their GEMM's epilogue (`own=triton`: ops.ladder.RELU_EPILOGUE_IMPLS),
each conv/linear layer followed directly by ReLU (no BatchNorm between) is one `Conv2dReLU` /
`LinearReLU` and the activation's slot holds an Identity — the same keys and draws, two fewer passes
over each activation (the ReLU's forward pass and its backward pass) per layer.

`ops="fused"` keeps PyTorch's layers except the first stage, conv1 → ReLU → max- or average pool, which is
our fused C++ CPU operator (trainlab.ops.conv_relu_pool): the layers where ours are measured faster
(benchmarks/results/lenet_cpu_step_fused.md). The stage keeps its four slots in `features`
(the fused module, then three Identity), so the state_dict keys are those of the `aten` model and a
checkpoint moves between the two. The fused model also computes conv2 in NCHW (`NCHWConv2d`: oneDNN's
input gradient for its 6-channel output is 1.8× as fast there) while the rest stays channels-last.
`ops="auto"` is `fused` on a CPU where it applies (--act relu,
no BatchNorm on conv1) and `aten` everywhere else (a GPU's cuDNN); `build_model`
resolves it with `resolve_ops` once the device is known.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn

from trainlab.errors import ConfigError
from trainlab.lenet.activations import OWN_ACTIVATIONS, make_activation, make_own_activation
from trainlab.ops.conv2d import Conv2d as OwnConv2d
from trainlab.ops.conv2d import Conv2dReLU
from trainlab.ops.conv_relu_pool2d import ConvReluPool2d
from trainlab.ops.ladder import RELU_EPILOGUE_IMPLS
from trainlab.ops.linear import Linear as OwnLinear
from trainlab.ops.linear import LinearReLU
from trainlab.ops.max_pool2d import MaxPool2d as OwnMaxPool2d

POOLS = {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}
OPS_IMPLS = ("python", "cpp", "triton", "cuda")


OPS_HELP = "aten, auto, fused, own or own=python|cpp|triton|cuda"


def parse_ops(spec: str) -> str | None:
    """--ops: None for PyTorch's layers (aten, and fused/auto, whose other layers are PyTorch's), else
    the trainlab.ops implementation of every layer ("own" means cpp)."""
    if spec in ("aten", "fused", "auto"):
        return None
    impl = "cpp" if spec == "own" else spec.removeprefix("own=") if spec.startswith("own=") else None
    if impl not in OPS_IMPLS:
        raise ConfigError(f"--ops {spec!r}: expected {OPS_HELP}")
    return impl


def fused_stage_applies(act: str, pool: str, batchnorm: bool, batchnorm_conv1: bool = True) -> bool:
    """The fused operator is conv → ReLU → max- or average pool: no other activation, no BatchNorm between."""
    return act == "relu" and pool in POOLS and not (batchnorm and batchnorm_conv1)


def resolve_ops(
    ops: str, device: torch.device, act: str, pool: str, batchnorm: bool, batchnorm_conv1: bool = True
) -> str:
    """--ops auto → fused on a CPU where it applies, else aten; any other value unchanged."""
    if ops != "auto":
        return ops
    return "fused" if device.type == "cpu" and fused_stage_applies(act, pool, batchnorm, batchnorm_conv1) else "aten"


def check_model_options(act: str, pool: str, batchnorm: bool, ops: str, batchnorm_conv1: bool = True) -> str | None:
    """Validate the model flags together (before any data loads); returns parse_ops(ops)."""
    impl = parse_ops(ops)
    if pool not in POOLS:
        raise ConfigError(f"--pool {pool!r}: expected one of {', '.join(POOLS)}")
    if ops == "fused" and not fused_stage_applies(act, pool, batchnorm, batchnorm_conv1):
        bn1 = " and no BatchNorm on conv1 (add --no-batchnorm-conv1)" if batchnorm and batchnorm_conv1 else ""
        raise ConfigError(
            f"--ops fused: the fused first stage is conv → ReLU → pool; it needs --act relu (got --act {act}){bn1}"
        )
    if impl is not None:
        if pool != "max":
            raise ConfigError(f"--ops {ops}: our pooling operator is max_pool2d; use --pool max")
        if act not in OWN_ACTIVATIONS:
            raise ConfigError(
                f"--ops {ops}: --act must be one of {', '.join(OWN_ACTIVATIONS)} (our operators), got {act!r}"
            )
    return impl


class NCHWConv2d(nn.Conv2d):
    """nn.Conv2d computed in NCHW whatever the layout of its input and weight; its output goes back to
    channels-last when the input came so, for the BatchNorm and max-pool after it (ATen's max-pool is
    several times slower in NCHW).

    Why: for LeNet's conv2 (6 → 16 channels, 14×14 → 10×10) oneDNN's input gradient, a convolution
    with 6 output channels, takes 1.8 times as long in channels-last as in NCHW (bf16, 1 thread, batch 256:
    3.4 vs 1.9 ms), while the forward and the weight gradient cost the same in both; the three layout
    copies cost 0.1–0.25 ms each (benchmarks/results/lenet_conv2_layout.md; the whole step:
    lenet_cpu_step_nchw2.md). In fp32 it is a wash (NCHW's weight gradient is slower). The layout
    changes only the order of the sums, not the function: same parameters, same state_dict.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        back_to_cl = x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
        y = self._conv_forward(x.contiguous(), self.weight.contiguous(), self.bias)
        return y.contiguous(memory_format=torch.channels_last) if back_to_cl else y


class LeNet5(nn.Module):
    def __init__(
        self,
        act: str = "relu",
        pool: str = "max",
        batchnorm: bool = False,
        num_classes: int = 10,
        ops: str = "aten",
        batchnorm_conv1: bool = True,
    ):
        super().__init__()
        if ops == "auto":
            raise ConfigError("--ops auto is resolved for a device first (lenet.model.resolve_ops)")
        impl = check_model_options(act, pool, batchnorm, ops, batchnorm_conv1)
        Conv, Pool, Linear, Act = nn.Conv2d, POOLS[pool], nn.Linear, make_activation
        if impl is not None:  # same constructors and argument order: the same random draws
            Conv, Pool, Linear = (partial(cls, impl=impl) for cls in (OwnConv2d, OwnMaxPool2d, OwnLinear))
            Act = partial(make_own_activation, impl=impl)
        norm2d = (lambda c: nn.BatchNorm2d(c)) if batchnorm else (lambda c: nn.Identity())
        norm1d = (lambda c: nn.BatchNorm1d(c)) if batchnorm else (lambda c: nn.Identity())
        bn1 = batchnorm and batchnorm_conv1
        self.fused = ops == "fused"
        # The layers whose ReLU runs in their own kernel: conv1 unless BatchNorm follows it; conv2, fc1
        # and fc2 without BatchNorm. Same constructors, same draws: only forward differs.
        epilogue = impl in RELU_EPILOGUE_IMPLS and act == "relu"
        fuse1, fuse_rest = epilogue and not bn1, epilogue and not batchnorm
        Conv1, Conv2, Hidden = Conv, Conv, Linear
        if fuse1:
            Conv1 = partial(Conv2dReLU, impl=impl)
        if fuse_rest:
            Conv2, Hidden = partial(Conv2dReLU, impl=impl), partial(LinearReLU, impl=impl)
        self.relu_epilogue = fuse1 or fuse_rest
        # Conv biases are redundant before BatchNorm (it has its own shift). conv1's weights are drawn
        # once, by whichever class runs it: the fused stage starts from the aten model's weights.
        conv1 = (partial(ConvReluPool2d, impl="cpp", pool=pool) if self.fused else Conv1)(
            1, 6, 5, padding=2, bias=not bn1
        )
        stage1 = [conv1, norm2d(6) if bn1 else nn.Identity(), Act(act), Pool(2)]  # 28→28→14
        conv2 = (NCHWConv2d if self.fused else Conv2)(6, 16, 5, bias=not batchnorm)
        stage2 = [conv2, norm2d(16), Act(act), Pool(2)]  # 14→10→5
        # max(relu(x)) == relu(max(x)), gradient included (the same first argmax in each window; zero
        # gradient where the window's max is ≤ 0): pooling first applies ReLU, forward and backward, to
        # a quarter of the values. Not for GELU (not monotone) nor average pooling.
        self.pool_first = act == "relu" and pool == "max"
        if self.pool_first:
            stage1[2:], stage2[2:] = stage1[:1:-1], stage2[:1:-1]
        if self.fused:  # same slots, same state_dict keys ("features.0.weight", …) as the aten stage
            stage1[1:] = [nn.Identity(), nn.Identity(), nn.Identity()]
        # a ReLU in its layer's kernel leaves the activation's slot (after the pool: pool_first) an Identity
        stage1[3], stage2[3] = (nn.Identity() if f else s[3] for f, s in ((fuse1, stage1), (fuse_rest, stage2)))
        hidden_act = nn.Identity if fuse_rest else partial(Act, act)
        self.features = nn.Sequential(*stage1, *stage2)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            Hidden(16 * 5 * 5, 120, bias=not batchnorm),
            norm1d(120),
            hidden_act(),
            Hidden(120, 84, bias=not batchnorm),
            norm1d(84),
            hidden_act(),
            Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.shape[1:] != (1, 28, 28):
            raise ValueError(f"LeNet5 expects input of shape [B, 1, 28, 28], got {list(x.shape)}")
        return self.classifier(self.features(x))

    @property
    def conv1(self) -> nn.Conv2d:
        return self.features[0]

    def first_layer_maps(self, x: torch.Tensor) -> torch.Tensor:
        """Activations after the first conv block, before pooling (for 'visualize intermediate layers')."""
        if self.fused:
            return self.features[0].conv_relu(x)
        return self.features[3 if self.pool_first else 2](self.features[:2](x))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
