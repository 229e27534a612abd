"""The compile-without-a-GPU harness itself: PTX/SASS parsing, tool discovery, a Triton kernel for sm_90."""

import os

import pytest

from trainlab.ops import kernel_check
from trainlab.ops.kernel_check import (
    find_tool,
    ptx_entries,
    sass_functions,
    sass_vector_widths,
    triton_ptx,
    vector_widths,
)


def test_vector_widths_reads_ptx_access_widths():
    ptx = """
    @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
    ld.global.nc.v2.b16 {%rs1, %rs2}, [%rd2];
    st.global.b32 [ %rd3 + 0 ], { %r5 };
    ld.shared.v4.b32 {%r1, %r2, %r3, %r4}, [%r9];
    """
    assert vector_widths(ptx) == {"ld": {128, 32}, "st": {32}}


def test_ptx_entries_split_kernels():
    ptx = (
        ".version 8.0\n.visible .entry vec(\n ld.global.nc.v4.u32 {%r1,%r2,%r3,%r4}, [%rd1];\n}\n"
        ".entry _ZN1a6scalarEv(\n ld.global.u16 %rs1, [%rd1];\n}\n"
    )
    entries = ptx_entries(ptx)
    assert list(entries) == ["vec", "_ZN1a6scalarEv"]
    assert vector_widths(entries["vec"]) == {"ld": {128}, "st": set()}
    assert vector_widths(entries["_ZN1a6scalarEv"]) == {"ld": {16}, "st": set()}


def test_sass_parsing():
    sass = """
        code for sm_90
                Function : vec_kernel
        /*01d0*/                   LDG.E.128.CONSTANT R4, desc[UR4][R4.64] ;
        /*0810*/                   STG.E.128 desc[UR4][R4.64], R8 ;
                Function : scalar_kernel
        /*0100*/                   LDG.E.U16.CONSTANT R2, desc[UR4][R2.64] ;
        /*0200*/                   LDG.E R3, desc[UR4][R6.64] ;
        /*0300*/                   STG.E.64 desc[UR4][R4.64], R8 ;
    """
    funcs = sass_functions(sass)
    assert list(funcs) == ["vec_kernel", "scalar_kernel"]
    assert sass_vector_widths(funcs["vec_kernel"]) == {"ld": {128}, "st": {128}}
    assert sass_vector_widths(funcs["scalar_kernel"]) == {"ld": {16, 32}, "st": {64}}


def test_find_tool_searches_the_nvidia_wheel_layouts(tmp_path, monkeypatch):
    """nvcc from `pip install cuda-toolkit[nvcc]` lives in site-packages/nvidia/cu13/bin (CUDA 13)
    or nvidia/cuda_nvcc/bin (CUDA 12): found without PATH or CUDA_HOME."""
    for layout in ("nvidia/cu13/bin", "nvidia/cuda_nvcc/bin"):
        site = tmp_path / layout.replace("/", "_")
        tool = site / layout / "nvcc"
        tool.parent.mkdir(parents=True)
        tool.write_text("#!/bin/sh\n")
        tool.chmod(0o755)
        monkeypatch.setenv("PATH", "/nonexistent")
        monkeypatch.delenv("CUDA_HOME", raising=False)
        monkeypatch.setattr(kernel_check.sys, "path", [str(site)])
        assert find_tool("nvcc") == str(tool)
    monkeypatch.setattr(kernel_check.sys, "path", [str(tmp_path / "empty")])
    assert find_tool("nvcc") is None
    with pytest.raises(kernel_check.HardwareError, match=r"\.\[nvcc\]"):
        kernel_check.nvcc_ptx(os.devnull)


def test_triton_kernel_compiles_for_sm90_with_vector_accesses_when_aligned(monkeypatch):
    pytest.importorskip("triton")
    from trainlab.ops.gelu.gelu_triton import _gelu_kernel

    # TRITON_INTERPRET=1 must not turn the ahead-of-time compile into an interpreter wrapper
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    sig = {
        "x_ptr": "*fp32",
        "g_ptr": "*fp32",
        "gg_ptr": "*fp32",
        "out_ptr": "*fp32",
        "n": "i32",
        "ORDER": "constexpr",
        "FORM": "constexpr",
        "F64": "constexpr",
        "BLOCK": "constexpr",
        "RNE_BF16": "constexpr",
    }
    consts = {"ORDER": 0, "FORM": 0, "F64": False, "BLOCK": 1024, "RNE_BF16": False}
    aligned = ("x_ptr", "g_ptr", "gg_ptr", "out_ptr", "n")
    assert vector_widths(triton_ptx(_gelu_kernel, sig, consts, 90, aligned=aligned)) == {"ld": {128}, "st": {128}}
    assert vector_widths(triton_ptx(_gelu_kernel, sig, consts, 90)) == {"ld": {32}, "st": {32}}  # unaligned: scalar
