"""The CUDA GELU kernels compiled by nvcc for sm_80 and sm_90 on a machine without a GPU.

`ops/gelu/gelu_cuda_kernels.cu` depends on CUDA alone (no ATen/c10), so plain nvcc compiles it — with
the flags PyTorch's extension build adds (no implicit half/bf16 conversions), in C++17 (torch ≤ 2.11)
and C++20 (torch 2.13). Every vector kernel must use only 128-bit global loads and stores, in the
PTX and in the SASS ptxas made from it. The ATen glue (`ops/gelu/gelu_cuda.cpp`) is syntax-checked
with the layers' glue against this torch's headers (tests/test_ops_layers_cuda.py). Skipped only when
no nvcc can be found; `make test` installs one from PyPI (`.[nvcc]`) on machines that have none.
"""

import re

import pytest

from trainlab.ops.build import OPS_DIR
from trainlab.ops.kernel_check import (
    ARCHS,
    demangle,
    find_nvcc,
    find_tool,
    nvcc_ptx,
    nvcc_sass,
    ptx_entries,
    sass_functions,
    sass_vector_widths,
    vector_widths,
)

CSRC = OPS_DIR / "gelu"  # GELU's folder: its kernels sit beside its Python
KERNELS = CSRC / "gelu_cuda_kernels.cu"
if find_nvcc() is None:
    pytest.skip(
        "no nvcc (CUDA_HOME, PATH, site-packages nvidia/*/bin): install it with "
        "`pip install -c requirements/constraints.txt '.[nvcc]'` (`make test` does when nvcc is missing)",
        allow_module_level=True,
    )

# (vec|scalar)_kernel<dtype, Op<Approx form>> in Itanium mangling; parsed without c++filt.
_NAME = re.compile(
    r"(vec|scalar)_kernelI(f|d|13__nv_bfloat16|6__half)NS\d*_\d+(Forward|Backward|DoubleBackward)"
    r"ILNS_6ApproxE([012])E"
)
DTYPE_BITS = {"f": 32, "d": 64, "13__nv_bfloat16": 16, "6__half": 16}


def _flags(std: str) -> tuple[str, ...]:
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    return ("-O3", f"-std={std}", *COMMON_NVCC_FLAGS)


def _kernels(named: dict[str, str]) -> dict[tuple, str]:
    out = {}
    for name, body in named.items():
        m = _NAME.search(name)
        assert m, f"unexpected kernel {demangle(name)}"
        out[m.groups()] = body
    # vec + scalar × 4 dtypes × 3 ops × 3 forms (exact, tanh, sigmoid)
    assert len(out) == 2 * 4 * 3 * 3, sorted(out)
    return out


@pytest.mark.parametrize("arch,std", [(80, "c++17"), (90, "c++20")])
def test_ptx_vector_kernels_use_128_bit_accesses(arch, std):
    ptx = nvcc_ptx(KERNELS, arch, _flags(std))
    assert f".target sm_{arch}" in ptx
    for (kind, dtype, op, tanh), body in _kernels(ptx_entries(ptx)).items():
        widths = vector_widths(body)
        expected = {128} if kind == "vec" else {DTYPE_BITS[dtype]}
        assert widths == {"ld": expected, "st": expected}, (kind, dtype, op, tanh, widths)


@pytest.mark.parametrize("arch", ARCHS)
def test_sass_vector_kernels_use_128_bit_accesses(arch):
    if find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump not found (it ships with Triton's wheel and the CUDA toolkit)")
    sass = nvcc_sass(KERNELS, arch, _flags("c++17"))
    for (kind, dtype, op, tanh), body in _kernels(sass_functions(sass)).items():
        if kind == "vec":
            assert sass_vector_widths(body) == {"ld": {128}, "st": {128}}, (dtype, op, tanh)


def test_kernel_file_depends_on_cuda_alone():
    includes = re.findall(r'#include\s+[<"]([^>"]+)[>"]', KERNELS.read_text())
    assert not [h for h in includes if h.split("/")[0] in ("ATen", "c10", "torch")], includes
