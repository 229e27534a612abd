"""The C++ (and, with a GPU, CUDA) GELU extension: JIT build, cached, registered as real operators.

`load()` compiles `csrc/gelu_cpu.cpp` (+ `csrc/gelu_cuda.cpp`, the ATen glue, and
`csrc/gelu_cuda_kernels.cu`, the CUDA-only kernels, when torch has CUDA and a GPU is visible) with
`torch.utils.cpp_extension.load` the first time it is called on a machine, and reuses the shared
library afterwards (ninja rebuilds only when a source or flag changed). The library defines

    trainlab::gelu_fwd(Tensor x, str approximate)                          y = GELU(x)
    trainlab::gelu_bwd(Tensor grad, Tensor x, str approximate)             grad * GELU'(x)
    trainlab::gelu_bwd2(Tensor grad_grad, Tensor grad, Tensor x, str a)    grad_grad * grad * GELU''(x)

with CPU (and CUDA) kernels; this module adds the autograd formulas and the fake (shape-only)
implementations, which is what lets `torch.compile(fullgraph=True)` trace through the ops and
`torch.library.opcheck` pass. Each op's autograd formula uses the next op, so derivatives of any
order are exact: gelu_fwd → gelu_bwd → (gelu_bwd, gelu_bwd2) → torch ops (`gelu_math.bwd2_backward`).

Build cache: `$TRAINLAB_CACHE/torch_extensions/<torch version>/<name>` if `TRAINLAB_CACHE` is set,
else `$XDG_CACHE_HOME/trainlab/...` (default `~/.cache/trainlab/...`). The extension name encodes
the CPU capability and whether CUDA is compiled in, so one cache serves several machine types.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import torch

from trainlab.errors import HardwareError
from trainlab.ops import gelu_math

CSRC = Path(__file__).resolve().parent / "csrc"

# Compiler flags per CPU capability that torch itself detected (and would use for F.gelu).
# The CPU_CAPABILITY_* macros select the matching at::vec::Vectorized specialisation.
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}

_lock = threading.Lock()
_loaded: dict | None = None


def cache_dir() -> Path:
    """Where compiled extensions are kept between runs."""
    root = os.environ.get("TRAINLAB_CACHE")
    if root:
        base = Path(root)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainlab"
    return base / "torch_extensions" / torch.__version__.replace("+", "_")


def cpu_capability() -> str:
    """The SIMD level the extension is compiled for: torch's own runtime choice (AVX512/AVX2/DEFAULT)."""
    cap = torch.backends.cpu.get_cpu_capability()
    return cap if cap in _CAPABILITY_FLAGS else "DEFAULT"


def _want_cuda() -> bool:
    from torch.utils.cpp_extension import CUDA_HOME

    return torch.version.cuda is not None and torch.cuda.is_available() and CUDA_HOME is not None


def _check_toolchain(with_cuda: bool) -> None:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise HardwareError(
            f"impl='cpp': no C++ compiler found ({cxx!r} is not on PATH); install g++ (e.g. apt-get install g++) "
            "or use impl='python'")
    try:
        from torch.utils.cpp_extension import verify_ninja_availability

        verify_ninja_availability()
    except RuntimeError:
        raise HardwareError("impl='cpp': the ninja build tool is missing; `pip install ninja` or use impl='python'") from None
    if with_cuda and shutil.which("nvcc") is None and not Path(os.environ.get("CUDA_HOME", "/nonexistent"), "bin", "nvcc").exists():
        raise HardwareError("impl='cuda': nvcc not found (set CUDA_HOME); use impl='cpp' on CPU or impl='python'")


def load(verbose: bool = False) -> dict:
    """Build (once) and load the extension; returns {'name', 'build_dir', 'cuda'}.

    Raises HardwareError with one line naming what is missing when the toolchain is absent or the
    build fails, and suggests impl='python'.
    """
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        from torch.utils import cpp_extension

        with_cuda = _want_cuda()
        cap = cpu_capability()
        _check_toolchain(with_cuda)
        name = f"trainlab_gelu_{cap.lower()}" + ("_cuda" if with_cuda else "")
        build_dir = cache_dir() / name
        build_dir.mkdir(parents=True, exist_ok=True)
        sources = [str(CSRC / "gelu_cpu.cpp")]
        if with_cuda:
            sources += [str(CSRC / "gelu_cuda.cpp"), str(CSRC / "gelu_cuda_kernels.cu")]
        try:
            cpp_extension.load(
                name=name,
                sources=sources,
                extra_cflags=["-O3", *_CAPABILITY_FLAGS.get(cap, [])],
                extra_cuda_cflags=["-O3"] if with_cuda else None,   # no fast-math: erff/expf stay accurate
                build_directory=str(build_dir),
                with_cuda=with_cuda,
                is_python_module=False,   # the library registers ops; no Python module needed
                verbose=verbose,
            )
        except (RuntimeError, OSError, ImportError) as e:
            lines = str(e).strip().splitlines() or ["unknown error"]
            first = next((ln.strip() for ln in lines if "error:" in ln), lines[0])[:300]
            raise HardwareError(
                f"impl='cpp': building the C++ GELU extension in {build_dir} failed ({first}); "
                "rerun with TRAINLAB_VERBOSE_BUILD=1 for the compiler log, or use impl='python'") from e
        _register_python_side()
        _loaded = {"name": name, "build_dir": str(build_dir), "cuda": with_cuda, "cpu_capability": cap}
        return _loaded


def _register_python_side() -> None:
    """Autograd formulas and fake implementations for the C++-defined ops."""

    @torch.library.register_fake("trainlab::gelu_fwd")
    def _gelu_fwd_fake(x, approximate):
        return torch.empty_like(x)

    @torch.library.register_fake("trainlab::gelu_bwd")
    def _gelu_bwd_fake(grad, x, approximate):
        return torch.empty_like(x)

    @torch.library.register_fake("trainlab::gelu_bwd2")
    def _gelu_bwd2_fake(grad_grad, grad, x, approximate):
        return torch.empty_like(x)

    def _save_inputs(ctx, inputs, output):
        *tensors, approximate = inputs
        ctx.save_for_backward(*tensors)   # gelu_fwd keeps only x, as F.gelu does
        ctx.approximate = approximate

    def _fwd_backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.ops.trainlab.gelu_bwd(grad, x, ctx.approximate), None

    def _bwd_backward(ctx, gg):
        # d/dgrad (grad * d(x)) = d(x): the same kernel on gg; d/dx = grad * d'(x): the bwd2 kernel
        grad, x = ctx.saved_tensors
        return (torch.ops.trainlab.gelu_bwd(gg, x, ctx.approximate),
                torch.ops.trainlab.gelu_bwd2(gg, grad, x, ctx.approximate), None)

    def _bwd2_backward(ctx, ggg):
        return (*gelu_math.bwd2_backward(ggg, *ctx.saved_tensors, ctx.approximate), None)

    torch.library.register_autograd("trainlab::gelu_fwd", _fwd_backward, setup_context=_save_inputs)
    torch.library.register_autograd("trainlab::gelu_bwd", _bwd_backward, setup_context=_save_inputs)
    torch.library.register_autograd("trainlab::gelu_bwd2", _bwd2_backward, setup_context=_save_inputs)


def gelu_cpp(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU through the compiled `trainlab::gelu_fwd` op (differentiable).

    Under torch.compile the op is traced like any ATen op (fake impl + autograd formula registered
    in `load`). The first call must happen outside the compiled region (or call `load()` first, as
    `GELU(impl="cpp")` does in its constructor): building takes a lock Dynamo cannot trace.
    """
    if _loaded is None:   # checked outside load() so torch.compile never traces the build lock
        load(verbose=bool(os.environ.get("TRAINLAB_VERBOSE_BUILD")))
    return torch.ops.trainlab.gelu_fwd(x, approximate)


def gelu_cuda(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU through the extension's CUDA kernel; x must live on a CUDA device."""
    if not torch.cuda.is_available():
        raise HardwareError(f"impl='cuda': no CUDA GPU is available (torch {torch.__version__}); "
                            "use impl='cpp' or impl='python' on CPU")
    if x.device.type != "cuda":
        raise HardwareError(f"impl='cuda': input is on {x.device}, expected a CUDA tensor; move it with "
                            "x.cuda() or use impl='cpp' for CPU tensors")
    info = _loaded if _loaded is not None else load(verbose=bool(os.environ.get("TRAINLAB_VERBOSE_BUILD")))
    if not info["cuda"]:
        raise HardwareError("impl='cuda': the extension was built without CUDA (no nvcc/CUDA_HOME at build time); "
                            "set CUDA_HOME and clear the build cache, or use impl='triton'/'python'")
    return torch.ops.trainlab.gelu_fwd(x, approximate)
