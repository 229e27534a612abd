"""Where the compiled rungs of our layer operators live, and getting one ready.

`cpp` and `cuda` are the same `trainlab::` ops of the C++ extension (layers_cpp: CPU kernels for
CPU tensors, CUDA kernels for CUDA tensors; `cuda` insists on the latter); `triton` is
layers_triton. Each module exposes `conv2d`, `max_pool2d`, `linear` and `relu` with the same
signatures, so an operator's dispatch is one line per rung. Triton is imported only when asked for.
"""

from __future__ import annotations

from types import ModuleType

from trainlab.ops import layers_cpp
from trainlab.ops.layer_args import check_impl


def compiled_rung(impl: str) -> ModuleType:
    """The module that runs impl 'cpp', 'cuda' or 'triton'."""
    if impl == "triton":
        from trainlab.ops import layers_triton  # heavy optional dependency

        return layers_triton
    if impl == "cuda":
        layers_cpp.require_cuda_build()
    return layers_cpp


def prepare(layer: str, impl: str) -> str:
    """Check `impl` for an nn.Module and build the extension now when it will be needed: outside any
    torch.compile region (the build takes a lock Dynamo cannot trace) and before training starts."""
    check_impl(layer, impl)
    if impl in ("cpp", "cuda"):
        layers_cpp.load()
    return impl
