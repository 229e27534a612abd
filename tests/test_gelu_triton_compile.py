"""The Triton GELU kernel compiled ahead of time for sm_80 and sm_90, no GPU needed (Triton's wheel
ships ptxas and cuobjdump): every order (forward, backward, double backward) × dtype × approximation,
with 128-bit global loads and stores when the launcher specializes the pointers as 16-byte aligned,
and 64-bit offsets. A kernel that no longer compiles, or loses its vector accesses, fails here."""

import re

import pytest

pytest.importorskip("triton")

from trainlab.ops.gelu.gelu_triton import FORMS, ORDERS, _gelu_kernel  # noqa: E402
from trainlab.ops.kernel_check import ARCHS, cubin_sass, find_tool, sass_vector_widths, triton_asm, vector_widths  # noqa: E402

POINTERS = ("x_ptr", "g_ptr", "gg_ptr", "out_ptr")
DTYPES = ("fp32", "bf16", "fp16", "fp64")


def _signature(dtype: str, n_type: str = "i64") -> dict:
    sig = {p: f"*{dtype}" for p in POINTERS}
    sig.update(n=n_type, ORDER="constexpr", FORM="constexpr", F64="constexpr", BLOCK="constexpr", RNE_BF16="constexpr")
    return sig


def _consts(order: int, dtype: str, form: int) -> dict:
    return {"ORDER": order, "FORM": form, "F64": dtype == "fp64", "BLOCK": 1024, "RNE_BF16": False}


@pytest.mark.parametrize("tanh", list(FORMS.values()), ids=list(FORMS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", list(ORDERS.values()), ids=list(ORDERS))
def test_every_variant_compiles_with_128_bit_accesses(order, dtype, tanh):
    for arch in ARCHS:
        ptx = triton_asm(_gelu_kernel, _signature(dtype), _consts(order, dtype, tanh), arch, aligned=(*POINTERS, "n"))[
            "ptx"
        ]
        assert f".target sm_{arch}" in ptx
        assert vector_widths(ptx) == {"ld": {128}, "st": {128}}, (arch, vector_widths(ptx))


def test_unaligned_launch_falls_back_to_element_accesses():
    ptx = triton_asm(_gelu_kernel, _signature("bf16", "i32"), _consts(1, "bf16", 0), 90)["ptx"]
    assert vector_widths(ptx) == {"ld": {16}, "st": {16}}


def test_machine_code_uses_128_bit_loads_and_stores():
    """The SASS ptxas produced, read with cuobjdump (bundled with Triton): LDG.E.128 / STG.E.128."""
    if find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump not found (it ships with Triton's wheel and the CUDA toolkit)")
    for arch in ARCHS:
        asm = triton_asm(_gelu_kernel, _signature("fp32"), _consts(2, "fp32", 1), arch, aligned=(*POINTERS, "n"))
        assert sass_vector_widths(cubin_sass(asm["cubin"])) == {"ld": {128}, "st": {128}}


def test_offsets_are_64_bit():
    """program_id is int32; it must be widened before `* BLOCK`, or element 2^31 and beyond wrap."""
    ttir = triton_asm(_gelu_kernel, _signature("fp32", "i32"), _consts(0, "fp32", 0), 90)["ttir"]
    pid = re.search(r"(%[\w.]+) = tt\.get_program_id x : i32", ttir)
    assert pid, ttir[:2000]
    widened = re.search(rf"(%[\w.]+) = arith\.extsi {re.escape(pid.group(1))} : i32 to i64", ttir)
    assert widened, "program_id is not sign-extended to i64"
    assert re.search(rf"arith\.muli {re.escape(widened.group(1))}, %[\w.]+ : i64", ttir), (
        "offset multiply is not 64-bit"
    )
