"""Run our CUDA kernel files on the CPU: compile them with g++ against tests/cuda_emu/cuda_emu.h (a
CPU stand-in for threads, blocks, shared memory and __syncthreads) and call them through ctypes.

The kernels and their host launchers run unchanged — only `kernel<<<grid, block, smem,
stream>>>(args)` is rewritten to `emu_launch(emu_cfg(grid, block, smem, stream), <kernel>, args)` and
the dynamic shared-memory declaration to the emulator's buffer — so a wrong index, a missing barrier
or a bad launch geometry fails on a machine without a GPU. What it cannot show: speed, and the
exact rounding of libdevice (the host libm stands in for erff/expf/tanhf).
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import torch

from trainlab.ops.build import OPS_DIR

SHIM = Path(__file__).resolve().parent / "cuda_emu"
_LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^;<>]*>)?)<<<(.*?)>>>\(")
_DYNAMIC_SMEM = re.compile(r"extern __shared__ __align__\(16\) unsigned char (\w+)\[\];")


def host_source(name: str) -> str:
    """The kernel file `ops/<name>` (e.g. "gelu/gelu_cuda_kernels.cu") as host C++ for the emulator."""
    text = (OPS_DIR / name).read_text()
    text = _DYNAMIC_SMEM.sub(r"unsigned char* \1 = emu_smem();", text)
    # A generic lambda keeps the launch's template-argument deduction (relu_fwd_kernel<<<…>>>(x, y, n)).
    return _LAUNCH.sub(r"emu_launch(emu_cfg(\2), [](auto... emu_a) { \1(emu_a...); }, ", text)


def build(name: str, wrappers: str, out_dir: Path) -> ctypes.CDLL:
    """Compile ops/<name> + extern "C" `wrappers` into a shared library in out_dir and load it."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        import pytest

        pytest.skip("no host C++ compiler")
    source = host_source(name) + "\n" + wrappers
    digest = hashlib.sha1((source + (SHIM / "cuda_emu.h").read_text()).encode()).hexdigest()[:12]
    lib = out_dir / f"emu_{Path(name).stem}_{digest}.so"
    if not lib.exists():
        src = out_dir / f"emu_{Path(name).stem}_{digest}.cpp"
        src.write_text(source)
        proc = subprocess.run(
            [
                cxx,
                "-std=c++20",
                "-O1",
                "-pthread",
                "-shared",
                "-fPIC",
                "-w",
                f"-I{SHIM}",
                f"-I{(OPS_DIR / name).parent}",
                str(src),
                "-o",
                str(lib),
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
    return ctypes.CDLL(str(lib))


def ptr(t: torch.Tensor | None):
    """A CPU tensor's data pointer for ctypes (None for a missing optional tensor)."""
    if t is None:
        return None
    assert t.device.type == "cpu" and t.is_contiguous()
    return ctypes.c_void_p(t.data_ptr())
