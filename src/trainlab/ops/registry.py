"""The operators: the one list that `trainlab ops check|bench`, `--op` and the lab iterate.

Every operator is one folder, `ops/<name>/` (llm.c's dev/cuda in spirit): its entry point and
nn.Module, its Python reference, its Triton, C++ and CUDA rungs, its registration (schemas, fakes,
autograd) and its check cases, side by side. Adding an operator is its folder plus one line here.
What the shared harness reads from an operator's package (`module(name)`):

    CASES            list[ladder.Case]: the check's shape cases (ops/check.py runs each on every rung)
    DTYPES           the dtypes `ops check` uses by default, e.g. ("float32", "bfloat16")
    gradcheck_case   gen -> (float64 inputs, fn(*inputs, impl)): gradcheck (and gradgradcheck when
                     DOUBLE_BACKWARD) in the autograd table
    REGISTERED       the rungs that are registered torch.library ops (opcheck'd); OPCHECK_EXTRA the
                     non-tensor arguments of `trainlab::<op>_fwd`, or `opcheck(impl, device)` of its own
    BENCH            ladder.BenchItem list: what `ops bench` times (LeNet-5's layers at their shapes,
                     GELU over tensor sizes)

Operators may share a compiled library where their kernels genuinely share code: conv2d,
max_pool2d, linear and relu are one C++/CUDA extension and one Triton module (ops/layers/, see its
__init__), which conv_relu_pool2d's C++ kernel is compiled into.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

OPS = (
    "gelu",
    "conv2d",
    "max_pool2d",
    "linear",
    "relu",
    "conv_relu_pool2d",
)


def module(op: str) -> ModuleType:
    """The operator's package, trainlab.ops.<op> (imported on first use)."""
    return import_module(f"trainlab.ops.{op}")
