"""One compiled library for every C++/CUDA operator of trainlab: JIT-compiled, cached, loaded once.

`LIBRARY.load()` compiles every operator's sources with `torch.utils.cpp_extension.load` the first
time it is called on a machine and reuses the shared library afterwards (ninja rebuilds only when a
source or flag changed). The CUDA sources are added when torch has CUDA, a GPU is visible and
CUDA_HOME is set. The library registers `trainlab::` ops (no Python module); each operator's folder
adds what C++ cannot — autograd formulas and fake (shape-only) kernels — with `LIBRARY.on_load`,
so `torch.library.opcheck` passes and `torch.compile(fullgraph=True)` traces through the ops.

One library, not one per operator: its C++ sources are one translation unit (`unity_source`), so the
torch headers they all include are parsed once. GELU's and the layers' libraries built apart took 29 s
and 38 s of CPU (g++ -O3, AVX2, the 2-core box); together 46 s. The lab, `ops check` and the test suite
build both; `train --preset fast` on a CPU (its fused first stage) pays ~8 s more at the first build.

Build cache: `$TRAINLAB_CACHE/torch_extensions/<torch version>/<name>` if `TRAINLAB_CACHE` is set,
else `$XDG_CACHE_HOME/trainlab/...` (default `~/.cache/trainlab/...`; `io.cache_root`). The name is
`trainlab_<stem>_<cpu capability>[_cuda]`, so one cache serves several machine types.

Builds take turns on trainlab's own lock, `BUILD_DIR/.trainlab-build.lock` (a `flock`, which the
kernel drops when its builder dies, even by SIGKILL), waiting at most `BUILD_LOCK_WAIT_S`. Holding
it, any `BUILD_DIR/lock` is torch's build lock left by an interrupted build (Ctrl-C or SIGTERM during
the first build left it, and torch then waits on it forever): it is removed, with a line saying so.

A missing compiler, a missing ninja or a failed build is one HardwareError line that names what is
missing and the fallback (impl='python').
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trainlab.errors import HardwareError, UserError
from trainlab.io import cache_root, open_control, read_fd
from trainlab.text import shown

BUILD_LOCK = ".trainlab-build.lock"
BUILD_LOCK_WAIT_S = 1800.0  # a first CUDA build takes minutes; a builder that never ends is not waited on for good
TORCH_BATON = "lock"  # torch.utils.file_baton.FileBaton's file in the build folder

OPS_DIR = Path(__file__).resolve().parent  # sources are named relative to it: "<op>/<file>.cpp"

# Compiler flags per CPU capability that torch itself detected (and would use for its own kernels).
# The CPU_CAPABILITY_* macros select the matching at::vec::Vectorized specialisation.
CAPABILITY_FLAGS = {
    "AVX512": [
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512dq",
        "-mfma",
        "-mf16c",
        "-DCPU_CAPABILITY=AVX512",
        "-DCPU_CAPABILITY_AVX512",
    ],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
}


def cache_dir() -> Path:
    """Where compiled extensions are kept between runs."""
    return cache_root() / "torch_extensions" / torch.__version__.replace("+", "_")


def cpu_capability() -> str:
    """The SIMD level the extension is compiled for: torch's own runtime choice (AVX512/AVX2/DEFAULT)."""
    cap = torch.backends.cpu.get_cpu_capability()
    return cap if cap in CAPABILITY_FLAGS else "DEFAULT"


def want_cuda() -> bool:
    from torch.utils.cpp_extension import CUDA_HOME

    return torch.version.cuda is not None and torch.cuda.is_available() and CUDA_HOME is not None


def check_toolchain(with_cuda: bool) -> None:
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise HardwareError(
            f"impl='cpp': no C++ compiler found ({cxx!r} is not on PATH); install g++ (e.g. apt-get install g++) "
            "or use impl='python'"
        )
    try:
        from torch.utils.cpp_extension import verify_ninja_availability

        verify_ninja_availability()
    except RuntimeError:
        raise HardwareError(
            "impl='cpp': the ninja build tool is missing; `pip install ninja` or use impl='python'"
        ) from None
    if (
        with_cuda
        and shutil.which("nvcc") is None
        and not Path(os.environ.get("CUDA_HOME", "/nonexistent"), "bin", "nvcc").exists()
    ):
        raise HardwareError("impl='cuda': nvcc not found (set CUDA_HOME); use impl='cpp' on CPU or impl='python'")


def build_extension(
    stem: str, what: str, cpu_sources: tuple[str, ...], cuda_sources: tuple[str, ...], verbose: bool = False
) -> dict:
    """Compile (or reuse) `trainlab_<stem>_<capability>[_cuda]` from sources under ops/ (each in its
    operator's folder, e.g. "gelu/gelu_cpu.cpp") and load it;
    returns {'name', 'build_dir', 'cuda', 'cpu_capability'}. `what` names it in the error line."""
    from torch.utils import cpp_extension

    with_cuda = want_cuda()
    cap = cpu_capability()
    check_toolchain(with_cuda)
    name = f"trainlab_{stem}_{cap.lower()}" + ("_cuda" if with_cuda else "")
    build_dir = cache_dir() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        with build_lock(build_dir, what):
            sources = [unity_source(build_dir, cpu_sources)] + [str(OPS_DIR / s) for s in cuda_sources if with_cuda]
            cpp_extension.load(
                name=name,
                sources=sources,
                build_directory=str(build_dir),
                with_cuda=with_cuda,
                extra_cflags=["-O3", *CAPABILITY_FLAGS.get(cap, [])],
                # no fast-math: erff/expf stay accurate
                extra_cuda_cflags=["-O3"] if with_cuda else None,
                is_python_module=False,  # the library registers ops; no Python module needed
                verbose=verbose,
            )
    except (RuntimeError, OSError, ImportError) as e:
        lines = str(e).strip().splitlines() or ["unknown error"]
        first = next((ln.strip() for ln in lines if "error:" in ln), lines[0])[:300]
        raise HardwareError(
            f"impl='cpp': building the C++ {what} extension in {build_dir} failed ({first}); "
            "rerun with TRAINLAB_VERBOSE_BUILD=1 for the compiler log, or use impl='python'"
        ) from e
    return {"name": name, "build_dir": str(build_dir), "cuda": with_cuda, "cpu_capability": cap}


UNITY = "cpu_sources.cpp"  # in the build folder: the one translation unit of an extension's C++ sources


def unity_source(build_dir: Path, cpu_sources: tuple[str, ...]) -> str:
    """BUILD_DIR/cpu_sources.cpp, which #includes every C++ source (by absolute path): compiled as one
    translation unit, the torch headers they all include (torch/library.h alone is ~9 s of CPU) are parsed
    once. The layers' two files: 65 s of CPU as two units, 36 s as one (g++ -O3, AVX2). The
    sources therefore share one namespace scope: no two may define the same static or anonymous-namespace
    name. ninja still rebuilds when an included file changes (its depfile lists them). Rewritten only when
    its text changes, so an unchanged build stays up to date."""
    path = build_dir / UNITY
    text = "".join(f'#include "{OPS_DIR / s}"\n' for s in cpu_sources)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return str(path)


@contextlib.contextmanager
def build_lock(build_dir: Path, what: str, wait_s: float | None = None):
    """Hold `build_dir` for one build (module docstring): wait for another builder at most `wait_s`, then
    clear torch's lock if an interrupted build left it."""
    wait_s = BUILD_LOCK_WAIT_S if wait_s is None else wait_s
    path = build_dir / BUILD_LOCK
    fd = open_control(path, os.O_RDWR | os.O_CREAT)
    try:
        deadline, said = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _builder(fd, path)
                if time.monotonic() >= deadline:
                    raise HardwareError(
                        f"impl='cpp': the {what} extension in {build_dir} is being built by another process "
                        f"({holder}) for more than {wait_s:g} s; wait for it or stop it, or use impl='python'"
                    ) from None
                if not said:
                    print(f"waiting for another build of the {what} extension ({holder})", file=sys.stderr, flush=True)
                    said = True
                time.sleep(0.5)
        baton = build_dir / TORCH_BATON
        if baton.exists() or baton.is_symlink():  # every builder holds our lock: this one's is gone
            baton.unlink()
            print(
                f"note: removed {shown(baton)}, the build lock an interrupted build left (its builder is gone)",
                file=sys.stderr,
                flush=True,
            )
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        yield
    finally:
        os.close(fd)  # drops the flock


def _builder(fd: int, path: Path) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(read_fd(fd, path, 4096, "a lock file"))
        return shown(f"pid {info['pid']}, since {info['started']}")
    except (OSError, ValueError, KeyError, TypeError, UserError):
        return "pid unknown"
    finally:
        os.lseek(fd, 0, os.SEEK_SET)


class Extension:
    """One extension, loaded at most once per process. Each operator whose kernels it holds adds its
    `register(with_cuda)` with `on_load` (autograd formulas, fakes); they run after the first
    successful load."""

    def __init__(self, stem: str, what: str, cpu_sources: tuple[str, ...], cuda_sources: tuple[str, ...]):
        self.stem, self.what, self.cpu_sources, self.cuda_sources = stem, what, cpu_sources, cuda_sources
        self.registrations: list[Callable[[bool], None]] = []
        self.loaded: dict | None = None
        self._lock = threading.Lock()

    def on_load(self, register: Callable[[bool], None]) -> None:
        """Run one operator's `register(with_cuda)` after loading, or now if already loaded."""
        with self._lock:
            self.registrations.append(register)
            if self.loaded is not None:
                register(self.loaded["cuda"])

    def load(self, verbose: bool = False) -> dict:
        """Build (once) and load; HardwareError (one line) when the toolchain is missing or the build fails."""
        with self._lock:
            if self.loaded is None:
                info = build_extension(self.stem, self.what, self.cpu_sources, self.cuda_sources, verbose)
                for register in self.registrations:
                    register(info["cuda"])
                self.loaded = info
            return self.loaded

    def ensure(self) -> dict:
        """load() unless already loaded — checked outside the lock so torch.compile never traces it."""
        return (
            self.loaded
            if self.loaded is not None
            else self.load(verbose=bool(os.environ.get("TRAINLAB_VERBOSE_BUILD")))
        )

    def require_cuda(self) -> None:
        """impl='cuda': the extension must have been built with its CUDA kernels."""
        if not self.ensure()["cuda"]:
            raise HardwareError(
                f"impl='cuda': the {self.what} extension was built without CUDA (no GPU or nvcc "
                "at build time); set CUDA_HOME and clear the build cache, or use impl='triton'/'python'"
            )


# Every operator's sources, under ops/ in the operator's folder. The C++ ones share one namespace scope
# (`unity_source`): each file keeps its names in a namespace of its own (trainlab_gelu, trainlab_layers,
# trainlab_fused) and defines its ops with TORCH_LIBRARY_FRAGMENT. conv_relu_pool2d reuses the layers'
# headers. The CUDA ones are translation units of their own.
LIBRARY = Extension(
    "ops",
    "operator",
    ("gelu/gelu_cpu.cpp", "layers/layers_cpu.cpp", "conv_relu_pool2d/conv_relu_pool_cpu.cpp"),
    ("gelu/gelu_cuda.cpp", "gelu/gelu_cuda_kernels.cu", "layers/layers_cuda.cu", "layers/layers_cuda_glue.cpp"),
)
