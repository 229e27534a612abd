"""Compile GPU kernels without a GPU: Triton ahead of time, CUDA with nvcc, and read what they became.

A kernel that was never compiled for the GPU is a kernel whose first run on a lent machine is spent
debugging. Both compilers run on a CPU-only machine: Triton's wheel ships `ptxas`, and `nvcc` is
either on the machine or installable from PyPI (`nvidia-cuda-nvcc`). The tests compile every kernel
for the architectures we target (sm_80 A100, sm_90 H100/H200) and read the PTX for the property that
decides an element-wise kernel's speed: 128-bit vector loads and stores (`ld.global.v4.b32`).

    ptx = triton_ptx(kernel_fn, {"x_ptr": "*fp32", "n": "i64", "BLOCK": "constexpr"}, {"BLOCK": 1024}, arch=90,
                     aligned=("x_ptr", "n"))
    vector_widths(ptx)   # {"ld": {128}, "st": {128}}
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from trainlab.errors import HardwareError

ARCHS = (80, 90)   # A100; H100/H200


def triton_ptx(fn, signature: dict[str, str], constexprs: dict[str, object], arch: int = 90,
               aligned: tuple[str, ...] = ()) -> str:
    """PTX of the Triton kernel `fn` (a plain function or a `triton.jit` one) for sm_`arch`.

    `signature` maps every argument to a Triton type ("*fp32", "*bf16", "i64", "constexpr"), and
    `aligned` names the arguments the launcher would specialize as divisible by 16 (pointers 16-byte
    aligned, sizes multiples of 16) — what `triton.jit` does at run time for such tensors."""
    import triton  # heavy optional dependency
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jit_fn = fn if isinstance(fn, triton.runtime.JITFunction) else triton.jit(fn)
    names = list(signature)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated to silence its warning
    src = ASTSource(fn=jit_fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32)).asm["ptx"]


def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME, the PATH, or the PyPI package `nvidia-cuda-nvcc` (its bin/ in site-packages)."""
    candidates = [Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"] if os.environ.get("CUDA_HOME") else []
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    for site in map(Path, sys.path):
        candidates += [site / "nvidia" / "cuda_nvcc" / "bin" / "nvcc", site / "nvidia" / "cu13" / "bin" / "nvcc"]
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def nvcc_ptx(source: str | os.PathLike, arch: int = 90, flags: tuple[str, ...] = ("-O3",)) -> str:
    """PTX of a CUDA source file compiled by nvcc for sm_`arch` (`-arch=sm_XX -ptx`).

    The source must depend on CUDA alone (no ATen/c10 headers), as llm.c's kernel files do."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise HardwareError("nvcc not found: set CUDA_HOME, put nvcc on PATH, or `pip install nvidia-cuda-nvcc`")
    with tempfile.TemporaryDirectory(prefix="trainlab_nvcc_") as tmp:
        out = Path(tmp) / "kernel.ptx"
        proc = subprocess.run([nvcc, f"-arch=sm_{arch}", "-ptx", *flags, "-o", str(out), os.fspath(source)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc -arch=sm_{arch} {source} failed:\n{proc.stderr.strip()}")
        return out.read_text()


_ACCESS = re.compile(r"\b(ld|st)\.global(?:\.[a-z]+)*?(?:\.v(\d))?\.(?:b|f|u|s)(\d+)\b")


def vector_widths(ptx: str) -> dict[str, set[int]]:
    """Bit widths of the global loads ("ld") and stores ("st") in `ptx`: 128 for `ld.global.v4.b32`."""
    widths: dict[str, set[int]] = {"ld": set(), "st": set()}
    for op, lanes, bits in _ACCESS.findall(ptx):
        widths[op].add(int(lanes or 1) * int(bits))
    return widths
