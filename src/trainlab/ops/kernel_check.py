"""Compile GPU kernels without a GPU: Triton ahead of time, CUDA with nvcc, and read what they became.

A kernel that was never compiled for the GPU is a kernel whose first run on a lent machine is spent
debugging. Both compilers run on a CPU-only machine: Triton's wheel ships `ptxas`, `cuobjdump` and
`nvdisasm`, and `nvcc` is either on the machine or installable from PyPI (`pip install
-c requirements/constraints.txt '.[nvcc]'`: `cuda-toolkit[nvcc,cccl]`, the NVIDIA wheels that lay it
out under site-packages/nvidia/cu13/). The tests compile every kernel for the architectures we target
(sm_80 A100, sm_90 H100/H200) and read the property that decides an element-wise kernel's speed:
128-bit vector loads and stores, in the PTX (`ld.global.v4.b32`) and, where cuobjdump is found, in
the machine code itself (SASS `LDG.E.128`).

The API (stable; other operator ladders use it the same way):

    ptx = triton_ptx(kernel_fn, {"x_ptr": "*fp32", "n": "i64", "BLOCK": "constexpr"}, {"BLOCK": 1024},
                     arch=90, aligned=("x_ptr", "n"))
    vector_widths(ptx)                       # {"ld": {128}, "st": {128}}
    asm = triton_asm(...same arguments...)   # {"ttir", "ttgir", "llir", "ptx", "cubin", ...}
    sass = cubin_sass(asm["cubin"])          # needs cuobjdump (Triton's bundled one is found)
    sass_vector_widths(sass)                 # {"ld": {128}, "st": {128}}

    ptx = nvcc_ptx("kernels.cu", arch=90, flags=("-O3",))   # CUDA-only source (no ATen/c10 headers)
    ptx_entries(ptx)                         # {mangled kernel name: its PTX body}
    demangle(name)                           # readable C++ name (c++filt), or the name unchanged
    sass = nvcc_sass("kernels.cu", arch=90)  # cubin → SASS
    sass_functions(sass)                     # {kernel name: its SASS}

Tools are found by `find_tool` (CUDA_HOME, PATH, the NVIDIA PyPI wheels, Triton's bundled binaries);
a missing one is a HardwareError naming how to get it.
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

ARCHS = (80, 90)  # A100; H100/H200

# Where the NVIDIA PyPI wheels put their binaries, relative to a site-packages directory:
# CUDA 13 wheels share nvidia/cu13/bin; CUDA 12 wheels have one folder per component.
_WHEEL_BIN_DIRS = ("nvidia/cu13/bin", "nvidia/cuda_nvcc/bin", "nvidia/cuda_cuobjdump/bin", "nvidia/cuda_nvdisasm/bin")
_INSTALL_HINT = {
    "nvcc": "set CUDA_HOME, put nvcc on PATH, or `pip install -c requirements/constraints.txt '.[nvcc]'`",
    "cuobjdump": "it ships with Triton (`pip install triton`) and with the CUDA toolkit",
    "nvdisasm": "it ships with Triton (`pip install triton`) and with the CUDA toolkit",
}


def _site_dirs() -> list[Path]:
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def find_tool(name: str) -> str | None:
    """Path of a CUDA tool (nvcc, cuobjdump, nvdisasm, ptxas): $CUDA_HOME/bin, the PATH, the NVIDIA
    PyPI wheels in site-packages, and (for everything but nvcc) Triton's bundled binaries."""
    candidates = [Path(os.environ["CUDA_HOME"]) / "bin" / name] if os.environ.get("CUDA_HOME") else []
    on_path = shutil.which(name)
    if on_path:
        candidates.append(Path(on_path))
    for site in _site_dirs():
        candidates += [site / d / name for d in _WHEEL_BIN_DIRS]
        if name != "nvcc":
            candidates.append(site / "triton" / "backends" / "nvidia" / "bin" / name)
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME, the PATH, or the PyPI packages (their bin/ in site-packages)."""
    return find_tool("nvcc")


def _require(name: str) -> str:
    path = find_tool(name)
    if path is None:
        raise HardwareError(f"{name} not found: {_INSTALL_HINT.get(name, 'install the CUDA toolkit')}")
    return path


# ---- Triton --------------------------------------------------------------------------------------


def triton_asm(
    fn, signature: dict[str, str], constexprs: dict[str, object], arch: int = 90, aligned: tuple[str, ...] = ()
) -> dict:
    """Every stage Triton compiled `fn` to for sm_`arch`: {"ttir", "ttgir", "llir", "ptx", "cubin", …}.

    `fn` is a plain function or a `JITFunction`. `signature` maps every argument to a Triton type
    ("*fp32", "*bf16", "i64", "constexpr"), and `aligned` names the arguments the launcher would
    specialize as divisible by 16 (pointers 16-byte aligned, sizes multiples of 16) — what the JIT
    does at run time for such tensors. Works with TRITON_INTERPRET=1 set (the JITFunction is built
    directly; `triton.jit` would return an interpreter wrapper)."""
    import triton  # heavy optional dependency
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    jit_fn = fn if isinstance(fn, JITFunction) else JITFunction(fn)
    names = list(signature)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, stated to silence its warning
    src = ASTSource(fn=jit_fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return dict(triton.compile(src, target=GPUTarget("cuda", arch, 32)).asm)


def triton_ptx(
    fn, signature: dict[str, str], constexprs: dict[str, object], arch: int = 90, aligned: tuple[str, ...] = ()
) -> str:
    """PTX of the Triton kernel `fn` for sm_`arch` (see `triton_asm` for the arguments)."""
    return triton_asm(fn, signature, constexprs, arch, aligned)["ptx"]


# ---- CUDA with nvcc -------------------------------------------------------------------------------


def _nvcc(source, arch: int, kind: str, flags: tuple[str, ...], out: Path) -> None:
    nvcc = _require("nvcc")
    proc = subprocess.run(
        [nvcc, f"-arch=sm_{arch}", f"-{kind}", *flags, "-o", str(out), os.fspath(source)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc -arch=sm_{arch} -{kind} {source} failed:\n{proc.stderr.strip()}")


def nvcc_ptx(source: str | os.PathLike, arch: int = 90, flags: tuple[str, ...] = ("-O3",)) -> str:
    """PTX of a CUDA source file compiled by nvcc for sm_`arch` (`-arch=sm_XX -ptx`).

    The source must depend on CUDA alone (no ATen/c10 headers), as llm.c's kernel files do."""
    with tempfile.TemporaryDirectory(prefix="trainlab_nvcc_") as tmp:
        out = Path(tmp) / "kernel.ptx"
        _nvcc(source, arch, "ptx", flags, out)
        return out.read_text()


def nvcc_sass(source: str | os.PathLike, arch: int = 90, flags: tuple[str, ...] = ("-O3",)) -> str:
    """SASS (the machine code ptxas made) of a CUDA source file for sm_`arch`: nvcc -cubin, cuobjdump."""
    with tempfile.TemporaryDirectory(prefix="trainlab_nvcc_") as tmp:
        out = Path(tmp) / "kernel.cubin"
        _nvcc(source, arch, "cubin", flags, out)
        return cubin_sass(out.read_bytes())


def cuda_include_dir() -> str | None:
    """The CUDA headers nvcc compiles against (cuda_runtime_api.h), for host-compiler syntax checks."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    proc = subprocess.run(
        [nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull], capture_output=True, text=True
    )
    for m in re.finditer(r'INCLUDES="([^"]*)"', proc.stdout + proc.stderr):
        for flag in m.group(1).split():
            d = Path(flag.strip('"')[2:]) if flag.strip('"').startswith("-I") else None
            if d is not None and (d / "cuda_runtime_api.h").is_file():
                return str(d.resolve())
    return None


# ---- reading what the compilers produced -----------------------------------------------------------


def cubin_sass(cubin: bytes) -> str:
    """`cuobjdump -sass` of a cubin (bytes). cuobjdump needs nvdisasm; both are searched for."""
    cuobjdump = _require("cuobjdump")
    env = dict(os.environ)
    nvdisasm = find_tool("nvdisasm")
    if nvdisasm:
        env["PATH"] = str(Path(nvdisasm).parent) + os.pathsep + env.get("PATH", "")
    with tempfile.TemporaryDirectory(prefix="trainlab_sass_") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass failed:\n{proc.stderr.strip()}")
    return proc.stdout


_ENTRY = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+([\w$]+)\s*\(", re.M)


def ptx_entries(ptx: str) -> dict[str, str]:
    """{kernel (entry) name: its PTX text up to the next entry}, names as in the PTX (mangled)."""
    starts = [(m.start(), m.group(1)) for m in _ENTRY.finditer(ptx)]
    return {
        name: ptx[pos : (starts[i + 1][0] if i + 1 < len(starts) else len(ptx))] for i, (pos, name) in enumerate(starts)
    }


_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$", re.M)


def sass_functions(sass: str) -> dict[str, str]:
    """{kernel name: its SASS}, from `cuobjdump -sass` output."""
    starts = [(m.start(), m.group(1)) for m in _FUNCTION.finditer(sass)]
    return {
        name: sass[pos : (starts[i + 1][0] if i + 1 < len(starts) else len(sass))]
        for i, (pos, name) in enumerate(starts)
    }


def demangle(name: str) -> str:
    """The C++ name of a mangled kernel symbol (via c++filt, when installed); else `name` itself."""
    tool = shutil.which("c++filt")
    if tool is None:
        return name
    proc = subprocess.run([tool, name], capture_output=True, text=True)
    return proc.stdout.strip() or name


_ACCESS = re.compile(r"\b(ld|st)\.global(?:\.[a-z]+)*?(?:\.v(\d))?\.(?:b|f|u|s)(\d+)\b")


def vector_widths(ptx: str) -> dict[str, set[int]]:
    """Bit widths of the global loads ("ld") and stores ("st") in `ptx`: 128 for `ld.global.v4.b32`."""
    widths: dict[str, set[int]] = {"ld": set(), "st": set()}
    for op, lanes, bits in _ACCESS.findall(ptx):
        widths[op].add(int(lanes or 1) * int(bits))
    return widths


_SASS_ACCESS = re.compile(r"\b(LDG|STG)\.E((?:\.[A-Z0-9_]+)*)")


def sass_vector_widths(sass: str) -> dict[str, set[int]]:
    """Bit widths of the global loads ("ld": LDG) and stores ("st": STG) in SASS: `LDG.E.128` → 128,
    `LDG.E.64` → 64, `LDG.E.U16` → 16, plain `LDG.E` → 32."""
    widths: dict[str, set[int]] = {"ld": set(), "st": set()}
    for op, mods in _SASS_ACCESS.findall(sass):
        bits = 32
        for mod in mods.split(".")[1:]:
            m = re.fullmatch(r"[US]?(8|16|32|64|128)", mod)
            if m:
                bits = int(m.group(1))
        widths["ld" if op == "LDG" else "st"].add(bits)
    return widths
