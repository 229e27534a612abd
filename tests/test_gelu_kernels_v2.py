"""GELU kernels, second round (issue 29): PyTorch's element-wise geometry for the CUDA kernels, the
third form x*sigmoid(1.702 x) in every rung, and the autograd formulas in C++.

Without a GPU: the CUDA kernel file compiled by nvcc for sm_80/sm_90 and read back (launch bounds,
loads per thread, registers and spills from ptxas) and run on the CPU by the host emulator
(tests/cuda_emu.py: vector path, tail, misaligned path, every dtype, order and form); the sigmoid
form on the CPU rungs and in Triton's interpreter against the float64 reference; the C++ autograd. On a GPU (marker
`gpu`, which fails rather than skips there): the CUDA rung on tails, misaligned views and every
dtype, the vector and scalar paths agreeing bit for bit.
"""

import re
import subprocess

import pytest
import torch

from trainlab.ops.build import OPS_DIR
from trainlab.ops.gelu import APPROXIMATIONS, gelu, gelu_math
from trainlab.ops.kernel_check import ARCHS, find_nvcc, nvcc_ptx, ptx_entries

KERNELS = OPS_DIR / "gelu" / "gelu_cuda_kernels.cu"
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="no nvcc (install the '.[nvcc]' extra)")


def _flags() -> tuple[str, ...]:
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    return ("-O3", "-std=c++17", *COMMON_NVCC_FLAGS)


# ---- the math ----------------------------------------------------------------------------------------


def test_three_forms_listed_once():
    assert APPROXIMATIONS == ("none", "tanh", "sigmoid")


def test_sigmoid_form_derivatives_match_autograd_of_its_forward():
    x = torch.linspace(-30, 30, 4001, dtype=torch.float64, requires_grad=True)
    y = gelu_math.forward(x, "sigmoid")
    (d,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    (d2,) = torch.autograd.grad(d.sum(), x, create_graph=True)
    (d3,) = torch.autograd.grad(d2.sum(), x)
    xd = x.detach()
    torch.testing.assert_close(y, xd * torch.sigmoid(1.702 * xd), rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(d, gelu_math.derivative(xd, "sigmoid"), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(d2, gelu_math.second_derivative(xd, "sigmoid"), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(d3, gelu_math.third_derivative(xd, "sigmoid"), rtol=1e-12, atol=1e-14)


def test_error_vs_exact_of_each_form():
    """Report 000's sigmoid form is ~0.02 from x Phi(x) (at x ~ -2.27); the tanh form 4.7e-4."""
    x = torch.linspace(-8, 8, 160001, dtype=torch.float64)
    assert gelu_math.error_vs_exact(gelu_math.forward(x, "none"), x) < 1e-15
    assert 4.6e-4 < gelu_math.error_vs_exact(gelu_math.forward(x, "tanh"), x) < 4.8e-4
    assert 0.0202 < gelu_math.error_vs_exact(gelu_math.forward(x, "sigmoid"), x) < 0.0204


def test_check_table_reports_error_vs_exact_for_every_form():
    """The shared check runs every form's cases, and GELU's own check records each rung's error
    against the exact form: the kernel's error for "none", the approximation's otherwise."""
    from trainlab.ops.check import format_table, run_check

    result = run_check(ops=["gelu"], impls=("aten", "python"), dtypes=("float32",), n=256)
    assert result["ok"], [r["reason"] for r in result["rows"] if not r["ok"]]
    vs_exact = {(r["impl"], r["case"]): r["checks"]["vs_exact"] for r in result["rows"] if r.get("checks")}
    assert set(vs_exact) == {(i, a) for i in ("aten", "python") for a in APPROXIMATIONS}
    for impl in ("aten", "python"):
        assert vs_exact[(impl, "none")] < 1e-5
        assert 4e-4 < vs_exact[(impl, "tanh")] < 5e-4
        assert 0.020 < vs_exact[(impl, "sigmoid")] < 0.021
    assert "vs_exact" in format_table(result)


# ---- the CPU rungs and Triton's interpreter, sigmoid form --------------------------------------------


@pytest.fixture(scope="module")
def ext():
    from trainlab.ops.gelu import load

    return load()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_cpp_sigmoid_form_matches_reference_every_order(ext, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.cat(
        [torch.randn(3000, dtype=torch.float64, generator=gen) * 4, torch.tensor([0.0, -0.0, 30.0, -30.0, 1e4, -1e4])]
    ).to(dtype)
    g = torch.randn(x.shape, dtype=torch.float64, generator=gen).to(dtype)
    xr = x.clone().requires_grad_()
    y = gelu(xr, impl="cpp", approximate="sigmoid")
    (dx,) = torch.autograd.grad(y, xr, g, create_graph=True)
    x64 = x.double().requires_grad_()
    ref = gelu_math.reference(x64, "sigmoid")
    (ref_dx,) = torch.autograd.grad(ref, x64, g.double(), create_graph=True)
    atol, rtol = {torch.float32: (2e-6, 2e-6), torch.float64: (1e-13, 1e-12), torch.bfloat16: (1e-5, 2.0**-7)}[dtype]
    torch.testing.assert_close(y.double(), ref.detach(), atol=atol, rtol=rtol)
    torch.testing.assert_close(dx.double(), ref_dx.detach(), atol=atol * 4, rtol=rtol)
    if dtype == torch.float64:  # the double backward through gelu_bwd's C++ formula and gelu_bwd2
        (h,) = torch.autograd.grad(dx, xr, g)
        (ref_h,) = torch.autograd.grad(ref_dx, x64, g.double())
        torch.testing.assert_close(h, ref_h, atol=1e-12, rtol=1e-10)


def test_cpp_sigmoid_gradcheck_and_gradgradcheck(ext):
    x = (torch.randn(20, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 3).requires_grad_()
    f = lambda t: gelu(t, impl="cpp", approximate="sigmoid")  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))


def test_triton_interpreted_sigmoid_form_every_order():
    pytest.importorskip("triton")
    from trainlab.ops.gelu.gelu_triton import gelu_triton

    x64 = torch.randn(300, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 4
    for dtype, tol in ((torch.float32, 4e-6), (torch.float64, 1e-12)):
        x = x64.to(dtype).requires_grad_()
        y = gelu_triton(x, "sigmoid", interpret=True)
        (dx,) = torch.autograd.grad(y, x, torch.ones_like(y), create_graph=True)
        (h,) = torch.autograd.grad(dx.sum(), x)
        xd = x.detach().double()
        torch.testing.assert_close(y.double(), gelu_math.forward(xd, "sigmoid"), atol=tol, rtol=tol)
        torch.testing.assert_close(dx.double(), gelu_math.derivative(xd, "sigmoid"), atol=tol, rtol=tol)
        torch.testing.assert_close(h.double(), gelu_math.second_derivative(xd, "sigmoid"), atol=tol, rtol=tol)


# ---- autograd in C++ ---------------------------------------------------------------------------------


def test_forward_and_backward_autograd_are_cpp_kernels(ext):
    """A Python formula (torch.library.register_autograd) puts the interpreter, and on a GPU the GIL
    handoff to autograd's device thread, into every backward: ~0.15 ms per call on the H100 host."""
    for op in ("gelu_fwd", "gelu_bwd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"trainlab::{op}", "Autograd"), op
    x = torch.randn(5, requires_grad=True)
    y = torch.ops.trainlab.gelu_fwd(x, "none")
    assert "CppNode" in type(y.grad_fn).__name__ or "GeluFwdFunction" in y.grad_fn.name(), y.grad_fn.name()
    (dx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    assert "GeluBwdFunction" in dx.grad_fn.name(), dx.grad_fn.name()


def test_compiled_graph_traces_the_cpp_autograd(ext):
    x = torch.randn(64, requires_grad=True)
    f = torch.compile(lambda t: gelu(t, impl="cpp", approximate="sigmoid").sum(), fullgraph=True, backend="aot_eager")
    (g,) = torch.autograd.grad(f(x), x)
    torch.testing.assert_close(g, gelu_math.derivative(x.detach(), "sigmoid"), atol=2e-6, rtol=2e-6)


# ---- CUDA kernels compiled, no GPU -----------------------------------------------------------------

_NAME = re.compile(
    r"(vec|scalar)_kernelI(f|d|13__nv_bfloat16|6__half)NS\d*_\d+(Forward|Backward|DoubleBackward)"
    r"ILNS_6ApproxE([012])E"
)
_INPUTS = {"Forward": 1, "Backward": 2, "DoubleBackward": 3}
_PACKS = {"f": 2, "d": 4, "13__nv_bfloat16": 1, "6__half": 1}  # 16-byte packs per thread: 8 elements


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_vector_kernel_is_one_shot_128_threads_8_elements(arch):
    """Every vector kernel: launch bounds of 128 threads, exactly (inputs x packs) 128-bit loads and
    `packs` 128-bit stores (8 elements per thread, no grid-stride loop), and no backward branch."""
    ptx = nvcc_ptx(KERNELS, arch, _flags())
    seen = 0
    for name, body in ptx_entries(ptx).items():
        m = _NAME.search(name)
        assert m, name
        kind, dtype, op, _ = m.groups()
        assert re.search(r"\.maxntid\s+128,\s*1,\s*1", body), (name, "launch bounds")
        if kind != "vec":
            continue
        seen += 1
        loads = re.findall(r"ld\.global(?:\.[a-z]+)*\.v\d\.", body)
        stores = re.findall(r"st\.global(?:\.[a-z]+)*\.v\d\.", body)
        assert len(loads) == _INPUTS[op] * _PACKS[dtype] and len(stores) == _PACKS[dtype], (
            name,
            len(loads),
            len(stores),
        )
        # a loop is a branch to a label defined earlier in the body
        defined = set()
        for line in body.splitlines():
            lab = re.match(r"^(\$\w+):", line)
            if lab:
                defined.add(lab.group(1))
            target = re.search(r"\bbra(?:\.uni)?\s+(\$\w+);", line)
            assert not (target and target.group(1) in defined), (name, "backward branch: a loop")
    assert seen == 4 * 3 * 3


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_float_and_half_forward_backward_fit_32_registers_without_spills(arch, tmp_path):
    """16 blocks of 128 threads per SM (a full SM) need <= 32 registers per thread: ptxas -v."""
    nvcc = find_nvcc()
    proc = subprocess.run(
        [nvcc, f"-arch=sm_{arch}", "-cubin", "-Xptxas", "-v", *_flags(), "-o", str(tmp_path / "k.cubin"), str(KERNELS)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    blocks = re.findall(
        r"Compiling entry function '(\S+)'.*?\n(?:.*\n)*?.*?(\d+) bytes spill stores, (\d+) bytes spill "
        r"loads\n.*?Used (\d+) registers",
        proc.stderr,
    )
    checked = 0
    for name, stores, loads, regs in blocks:
        m = _NAME.search(name)
        if m and m.group(2) != "d" and m.group(3) != "DoubleBackward":
            checked += 1
            assert int(regs) <= 32 and stores == loads == "0", (name, regs, stores, loads)
    assert checked == 2 * 3 * 2 * 3  # vec+scalar x float/bf16/half x fwd/bwd x forms


# ---- on a GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_cuda_tails_and_misaligned_views(approximate, dtype):
    from trainlab.ops.gelu import load

    load()
    for n in (1, 7, 1023, 1024, 1025, 4097, 3 * 1024 * 1024 + 5):
        base = (torch.randn(n + 1, dtype=torch.float64, device="cuda") * 3).to(dtype)
        for x in (base[:n], base[1:]):  # 16-byte aligned (vector kernel + tail) and misaligned (scalar)
            g = torch.randn(x.shape, dtype=torch.float64, device="cuda").to(dtype)
            y = torch.ops.trainlab.gelu_fwd(x, approximate)
            dx = torch.ops.trainlab.gelu_bwd(g, x, approximate)
            x64 = x.double().requires_grad_()
            ref = gelu_math.reference(x64, approximate)
            (ref_dx,) = torch.autograd.grad(ref, x64, g.double())
            atol, rtol = {torch.float64: (1e-13, 1e-12), torch.float32: (2e-6, 2e-6)}.get(dtype, (1e-5, 2.0**-7))
            if dtype == torch.float16:
                rtol = 2.0**-10
            torch.testing.assert_close(y.double(), ref.detach(), atol=atol, rtol=rtol)
            torch.testing.assert_close(dx.double(), ref_dx, atol=atol * float(g.abs().max()), rtol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_cuda_vector_and_scalar_paths_agree_bit_for_bit(approximate):
    from trainlab.ops.gelu import load

    load()
    aligned = torch.randn(8 * 1024, device="cuda")
    misaligned = torch.empty(8 * 1024 + 1, device="cuda")[1:]
    misaligned.copy_(aligned)
    assert misaligned.data_ptr() % 16 != 0
    a = torch.ops.trainlab.gelu_fwd(aligned, approximate)
    b = torch.ops.trainlab.gelu_fwd(misaligned, approximate)
    assert torch.equal(a, b)


# ---- the CUDA kernels run on the CPU (tests/cuda_emu.py) ----------------------------------------------

_EMU_WRAPPERS = r"""
namespace emu_g = trainlab_gelu_cuda;
extern "C" {
int emu_gelu_forward(int dtype, int approx, const void* x, void* y, int64_t n) {
  return emu_g::launch_forward(emu_g::Dtype(dtype), emu_g::Approx(approx), x, y, n, nullptr);
}
int emu_gelu_backward(int dtype, int approx, const void* g, const void* x, void* dx, int64_t n) {
  return emu_g::launch_backward(emu_g::Dtype(dtype), emu_g::Approx(approx), g, x, dx, n, nullptr);
}
int emu_gelu_double_backward(int dtype, int approx, const void* gg, const void* g, const void* x, void* out, int64_t n) {
  return emu_g::launch_double_backward(emu_g::Dtype(dtype), emu_g::Approx(approx), gg, g, x, out, n, nullptr);
}
}
"""
_EMU_DTYPES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2, torch.float16: 3}  # the kernels' Dtype enum


@pytest.fixture(scope="module")
def emu_gelu(tmp_path_factory):
    import ctypes

    from cuda_emu import build

    lib = build("gelu/gelu_cuda_kernels.cu", _EMU_WRAPPERS, tmp_path_factory.mktemp("emu_gelu"))
    for f, pointers in ((lib.emu_gelu_forward, 2), (lib.emu_gelu_backward, 3), (lib.emu_gelu_double_backward, 4)):
        f.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * pointers + [ctypes.c_int64]
    return lib


@pytest.mark.parametrize("dtype", list(_EMU_DTYPES), ids=str)
def test_emulated_cuda_kernels_every_path_and_form(emu_gelu, dtype):
    """2 full blocks + a 7-element tail (vector kernel + scalar tail), and the same values one element
    off 16-byte alignment (scalar kernel only): every order and form against the float64 math, and
    the two paths equal bit for bit."""
    n = 2 * 1024 + 7
    gen = torch.Generator().manual_seed(11)
    values = {k: (torch.randn(n, dtype=torch.float64, generator=gen) * 3).to(dtype) for k in ("x", "g", "gg")}

    def placed(offset):  # the same values at a 16-byte aligned address (0) or one element past it (1)
        out = {}
        for k, v in values.items():
            buf = torch.empty(n + 1, dtype=dtype)
            buf[offset : offset + n] = v
            out[k] = buf[offset : offset + n]
        return out

    atol, rtol = {torch.float64: (1e-13, 1e-12), torch.float32: (4e-6, 4e-6)}.get(dtype, (2e-5, 2.0**-7))
    if dtype == torch.float16:
        rtol = 2.0**-10
    for form, approx in enumerate(APPROXIMATIONS):
        results = []
        for offset in (0, 1):
            view = placed(offset)
            x, g, gg = view["x"], view["g"], view["gg"]
            assert (x.data_ptr() % 16 == 0) == (offset == 0)
            outs = [torch.empty_like(x) for _ in range(3)]
            assert emu_gelu.emu_gelu_forward(_EMU_DTYPES[dtype], form, x.data_ptr(), outs[0].data_ptr(), n) == 0
            assert (
                emu_gelu.emu_gelu_backward(_EMU_DTYPES[dtype], form, g.data_ptr(), x.data_ptr(), outs[1].data_ptr(), n)
                == 0
            )
            assert (
                emu_gelu.emu_gelu_double_backward(
                    _EMU_DTYPES[dtype], form, gg.data_ptr(), g.data_ptr(), x.data_ptr(), outs[2].data_ptr(), n
                )
                == 0
            )
            x64, g64, gg64 = x.double(), g.double(), gg.double()
            refs = (
                gelu_math.forward(x64, approx),
                g64 * gelu_math.derivative(x64, approx),
                gg64 * g64 * gelu_math.second_derivative(x64, approx),
            )
            for out, ref, scale in zip(outs, refs, (1.0, float(g64.abs().max()), float((gg64 * g64).abs().max()))):
                torch.testing.assert_close(
                    out.double(), ref, atol=atol * scale * 4, rtol=rtol, msg=f"{approx} offset {offset}"
                )
            results.append(outs)
        for a, b in zip(*results):
            assert torch.equal(a, b), approx
