"""Activation functions chosen by name (`--act NAME`).

The GELU implementations live in `trainlab.ops`; a `GELU(impl=...)` is built only when its name is
asked for, so that asking for `relu` never JIT-compiles the C++ extension or imports Triton.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn

from trainlab.errors import ConfigError
from trainlab.ops import GELU
from trainlab.ops.relu import ReLU


def _gelu_impl(impl: str, approximate: str = "none") -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        return GELU(impl=impl, approximate=approximate)

    return make


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "sigmoid": nn.Sigmoid,  # the 1998 LeNet-5 used squashing functions
    "silu": nn.SiLU,
    "gelu": nn.GELU,  # F.gelu, the reference
    "gelu-tanh": lambda: nn.GELU(approximate="tanh"),
    "gelu-torch": _gelu_impl("aten"),  # the aten rung through GELU(); the name predates "aten"
    "gelu-python": _gelu_impl("python"),
    "gelu-cpp": _gelu_impl("cpp"),
    "gelu-triton": _gelu_impl("triton"),
    "gelu-cuda": _gelu_impl("cuda"),
}


def make_activation(name: str) -> nn.Module:
    try:
        factory = ACTIVATIONS[name]
    except KeyError:
        raise ConfigError(f"--act {name!r}: unknown activation; choose one of {', '.join(ACTIVATIONS)}") from None
    return factory()


# `--ops own`: the activation from our operators, at the same rung as the layers.
OWN_ACTIVATIONS = {
    "relu": lambda impl: ReLU(impl=impl),
    "gelu": lambda impl: GELU(impl=impl),
    "gelu-tanh": lambda impl: GELU(impl=impl, approximate="tanh"),
}


def make_own_activation(name: str, impl: str) -> nn.Module:
    try:
        factory = OWN_ACTIVATIONS[name]
    except KeyError:
        raise ConfigError(f"--act {name!r} with --ops own: choose one of {', '.join(OWN_ACTIVATIONS)}") from None
    return factory(impl)
