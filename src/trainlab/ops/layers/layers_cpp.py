"""The C++ (and, with a GPU, CUDA) layer kernels: conv2d, max_pool2d, linear, relu as `trainlab::` ops.

`load()` JIT-builds trainlab's one library through ops/build.py, as
`trainlab_ops_<capability>[_cuda]`; the layers' part is `layers_cpu.cpp` (+ `layers_cuda.cu` and its
ATen glue `layers_cuda_glue.cpp` when torch has CUDA and a GPU is visible). After loading, `register`
(below) adds what C++ cannot: the autograd formulas and the fake kernels, so that
`torch.library.opcheck` passes and `torch.compile(fullgraph=True)` traces through the ops. The Triton
rung (layers_triton.py) defines the same nine ops as `trainlab::triton_*` and registers them with the
same `register`.

The ops (schemas in layers_cpu.cpp):
    conv2d_fwd(x, weight, bias?, padding)                         -> out
    conv2d_bwd_input(grad, weight, padding)                       -> dx
    conv2d_bwd_weight(grad, x, weight, padding, bias)             -> (dweight, dbias)
    max_pool2d_fwd(x, kernel, stride, padding)                    -> (out, window-local argmax)
    max_pool2d_bwd(grad, indices, input_hw, kernel, stride, padding) -> dx
    max_pool2d_bwd_atomic(...)   CUDA builds only: the naive atomicAdd scatter, kept for the benchmark
    linear_fwd(x, weight, bias?)                                  -> out
    linear_bwd(grad, x, weight, bias)                             -> (dx, dweight, dbias)
    relu_fwd(x) -> out;  relu_bwd(grad, out) -> dx
    conv_relu_pool2d_fwd(x, weight, bias?, padding, avg)          -> (out, one code byte per output)
        CPU only (ops/conv_relu_pool2d/conv_relu_pool_cpu.cpp): LeNet's first stage fused, compiled
        into this library (it reuses the layer kernels' headers and one build); registered there
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch

from trainlab.ops.build import LIBRARY
from trainlab.ops.ladder import check_impl
from trainlab.ops.layers.layer_args import register

# conv_relu_pool2d's C++ file uses the layers' headers; its folder registers its ops' fakes and autograd
# with LIBRARY.on_load too.
LIBRARY.on_load(lambda with_cuda: register("", with_atomic_pool=with_cuda))


def load(verbose: bool = False) -> dict:
    """Build (once) and load the library with the layer kernels;
    returns {'name', 'build_dir', 'cuda', 'cpu_capability'}."""
    return LIBRARY.load(verbose)


# ---- dispatch to a compiled rung ---------------------------------------------------------------------


def compiled_rung(impl: str) -> ModuleType:
    """The module that runs layer impl 'cpp', 'cuda' or 'triton' (conv2d, max_pool2d, linear, relu,
    each with the same signature, so an operator's dispatch is one line per rung). `cpp` and `cuda`
    are the same extension ops (CPU kernels for CPU tensors, CUDA kernels for CUDA tensors); Triton
    is imported only when asked for."""
    if impl == "triton":
        from trainlab.ops.layers import layers_triton  # heavy optional dependency

        return layers_triton
    if impl == "cuda":
        LIBRARY.require_cuda()
    return sys.modules[__name__]


def prepare(layer: str, impl: str) -> str:
    """Check `impl` for an nn.Module and build the extension now when it will be needed: outside any
    torch.compile region (the build takes a lock Dynamo cannot trace) and before training starts."""
    check_impl(layer, impl)
    if impl in ("cpp", "cuda"):
        LIBRARY.load()
    return impl


# ---- entry points used by the cpp / cuda rungs (arguments already validated by layer_args) ------


def conv2d(x, weight, bias, padding) -> torch.Tensor:
    LIBRARY.ensure()
    return torch.ops.trainlab.conv2d_fwd(x, weight, bias, list(padding))


def max_pool2d(x, kernel, stride, padding) -> torch.Tensor:
    LIBRARY.ensure()
    return torch.ops.trainlab.max_pool2d_fwd(x, list(kernel), list(stride), list(padding))[0]


def linear(x, weight, bias) -> torch.Tensor:
    LIBRARY.ensure()
    return torch.ops.trainlab.linear_fwd(x, weight, bias)


def relu(x) -> torch.Tensor:
    LIBRARY.ensure()
    return torch.ops.trainlab.relu_fwd(x)


def conv_relu_pool2d(x, weight, bias, padding, avg: bool = False) -> torch.Tensor:
    LIBRARY.ensure()
    return torch.ops.trainlab.conv_relu_pool2d_fwd(x, weight, bias, list(padding), avg)[0]
