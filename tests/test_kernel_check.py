"""The compile-without-a-GPU harness itself: PTX parsing, and a Triton kernel compiled for sm_90."""

import pytest

from trainlab.ops.kernel_check import triton_ptx, vector_widths


def test_vector_widths_reads_ptx_access_widths():
    ptx = """
    @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
    ld.global.nc.v2.b16 {%rs1, %rs2}, [%rd2];
    st.global.b32 [ %rd3 + 0 ], { %r5 };
    ld.shared.v4.b32 {%r1, %r2, %r3, %r4}, [%r9];
    """
    assert vector_widths(ptx) == {"ld": {128, 32}, "st": {32}}


def test_triton_kernel_compiles_for_sm90_with_vector_accesses_when_aligned():
    pytest.importorskip("triton")
    from trainlab.ops.gelu_triton import _gelu_fwd_kernel

    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "TANH": "constexpr", "F64": "constexpr",
           "BLOCK": "constexpr", "RNE_BF16": "constexpr"}
    consts = {"TANH": False, "F64": False, "BLOCK": 1024, "RNE_BF16": False}
    assert vector_widths(triton_ptx(_gelu_fwd_kernel, sig, consts, 90, aligned=("x_ptr", "y_ptr", "n"))) == {"ld": {128}, "st": {128}}
    assert vector_widths(triton_ptx(_gelu_fwd_kernel, sig, consts, 90)) == {"ld": {32}, "st": {32}}  # unaligned: scalar
