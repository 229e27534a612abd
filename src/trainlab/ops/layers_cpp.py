"""The C++ (and, with a GPU, CUDA) layer extension: conv2d, max_pool2d, linear, relu as `trainlab::` ops.

`load()` JIT-builds `csrc/layers_cpu.cpp` (+ `csrc/layers_cuda.cu` and its ATen glue
`csrc/layers_cuda_glue.cpp` when torch has CUDA and a GPU is visible) the first time it is called,
with the GELU extension's cache root, toolchain checks and CPU-capability flags (gelu_cpp.py), but
as its own library `trainlab_layers_<capability>[_cuda]`: the two extensions never rebuild or
overwrite each other. After loading, layer_autograd adds what C++ cannot: the autograd formulas
and the fake kernels, so that `torch.library.opcheck` passes and `torch.compile(fullgraph=True)`
traces through the ops.

The ops (schemas in csrc/layers_cpu.cpp):
    conv2d_fwd(x, weight, bias?, padding)                         -> out
    conv2d_bwd_input(grad, weight, padding)                       -> dx
    conv2d_bwd_weight(grad, x, weight, padding, bias)             -> (dweight, dbias)
    max_pool2d_fwd(x, kernel, stride, padding)                    -> (out, window-local argmax)
    max_pool2d_bwd(grad, indices, input_hw, kernel, stride, padding) -> dx
    max_pool2d_bwd_atomic(...)   CUDA builds only: the naive atomicAdd scatter, kept for the benchmark
    linear_fwd(x, weight, bias?)                                  -> out
    linear_bwd(grad, x, weight, bias)                             -> (dx, dweight, dbias)
    relu_fwd(x) -> out;  relu_bwd(grad, out) -> dx
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

from trainlab.errors import HardwareError
from trainlab.ops import gelu_cpp, layer_autograd

CSRC = Path(__file__).resolve().parent / "csrc"
CPU_SOURCES = ("layers_cpu.cpp",)
CUDA_SOURCES = ("layers_cuda.cu", "layers_cuda_glue.cpp")

_lock = threading.Lock()
_loaded: dict | None = None


def extension_name(cap: str, with_cuda: bool) -> str:
    return f"trainlab_layers_{cap.lower()}" + ("_cuda" if with_cuda else "")


def load(verbose: bool = False) -> dict:
    """Build (once) and load the extension; returns {'name', 'build_dir', 'cuda', 'cpu_capability'}.

    HardwareError (one line) when the toolchain is missing or the build fails."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        from torch.utils import cpp_extension

        with_cuda = gelu_cpp._want_cuda()
        cap = gelu_cpp.cpu_capability()
        gelu_cpp._check_toolchain(with_cuda)
        name = extension_name(cap, with_cuda)
        build_dir = gelu_cpp.cache_dir() / name
        build_dir.mkdir(parents=True, exist_ok=True)
        sources = [str(CSRC / s) for s in CPU_SOURCES + (CUDA_SOURCES if with_cuda else ())]
        try:
            cpp_extension.load(name=name, sources=sources, build_directory=str(build_dir), with_cuda=with_cuda,
                               extra_cflags=["-O3", *gelu_cpp._CAPABILITY_FLAGS.get(cap, [])],
                               extra_cuda_cflags=["-O3"] if with_cuda else None,
                               is_python_module=False, verbose=verbose)
        except (RuntimeError, OSError, ImportError) as e:
            lines = str(e).strip().splitlines() or ["unknown error"]
            first = next((ln.strip() for ln in lines if "error:" in ln), lines[0])[:300]
            raise HardwareError(f"impl='cpp': building the C++ layer extension in {build_dir} failed ({first}); "
                                "rerun with TRAINLAB_VERBOSE_BUILD=1 for the compiler log, or use impl='python'") from e
        layer_autograd.register("", with_atomic_pool=with_cuda)   # fakes + autograd formulas
        _loaded = {"name": name, "build_dir": str(build_dir), "cuda": with_cuda, "cpu_capability": cap}
        return _loaded


def _ensure_loaded() -> None:
    if _loaded is None:   # checked outside load() so torch.compile never traces the build lock
        load(verbose=bool(os.environ.get("TRAINLAB_VERBOSE_BUILD")))


# ---- entry points used by the cpp / cuda rungs (arguments already validated by layer_args) ------

def conv2d(x, weight, bias, padding) -> torch.Tensor:
    _ensure_loaded()
    return torch.ops.trainlab.conv2d_fwd(x, weight, bias, list(padding))


def max_pool2d(x, kernel, stride, padding) -> torch.Tensor:
    _ensure_loaded()
    return torch.ops.trainlab.max_pool2d_fwd(x, list(kernel), list(stride), list(padding))[0]


def linear(x, weight, bias) -> torch.Tensor:
    _ensure_loaded()
    return torch.ops.trainlab.linear_fwd(x, weight, bias)


def relu(x) -> torch.Tensor:
    _ensure_loaded()
    return torch.ops.trainlab.relu_fwd(x)


def require_cuda_build() -> None:
    """impl='cuda': the extension must have been built with its CUDA kernels."""
    info = _loaded if _loaded is not None else load(verbose=bool(os.environ.get("TRAINLAB_VERBOSE_BUILD")))
    if not info["cuda"]:
        raise HardwareError("impl='cuda': the layer extension was built without CUDA (no GPU or nvcc at build time); "
                            "set CUDA_HOME and clear the build cache, or use impl='triton'/'cpp'")
