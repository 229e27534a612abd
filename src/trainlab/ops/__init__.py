"""Our operators, one folder each (ops/registry.py lists them): gelu, conv2d, max_pool2d, linear,
relu, conv_relu_pool2d. Each is a ladder of five rungs (ops/ladder.py: aten, python, cpp, triton,
cuda) checked by one harness (check.py), timed by one benchmark (bench.py) and built by one
extension builder (build.py).

    from trainlab.ops.gelu import gelu, GELU, IMPLS
    y = gelu(x, impl="cpp", approximate="none")

The C++ extensions and Triton are built or imported only when their rung is used.
"""

import importlib

# GELU's names, imported on first use: the CLI's flags (ops.config) and `--help` must not pay for torch.
# The function `gelu` is `trainlab.ops.gelu.gelu`: `trainlab.ops.gelu` is its folder (a package).
_GELU_EXPORTS = ("GELU", "IMPLS", "APPROXIMATIONS", "GeluFunction")
__all__ = list(_GELU_EXPORTS)


def __getattr__(name: str):
    if name not in _GELU_EXPORTS:
        raise AttributeError(f"module 'trainlab.ops' has no attribute {name!r}")
    return getattr(importlib.import_module("trainlab.ops.gelu"), name)
