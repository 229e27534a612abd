"""The CUDA convolution kernels (issue 29: direct / implicit-GEMM forward and input gradient, a
deterministic two-stage weight gradient) proved on the CPU: csrc/layers_cuda.cu runs unchanged —
kernels and launchers — under the host emulator of tests/cuda_emu.py (threads, blocks, shared memory
and barriers on std::thread), against ATen's F.conv2d and its autograd in float64 and float32.

On a GPU (marker `gpu`, failing rather than skipping there): the same comparisons through the
registered ops at LeNet's batch 4096, and the weight gradient identical bit for bit run to run.
"""

import ctypes

import pytest
import torch
import torch.nn.functional as F
from cuda_emu import build, ptr

WRAPPERS = r"""
namespace emu_k = trainlab_layers_cuda;
static emu_k::ConvGeom emu_geom(const int64_t* g) {
  return {g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10]};
}
extern "C" {
int64_t emu_conv_packed_elems(const int64_t* g) { return emu_k::conv_packed_elems(emu_geom(g)); }
int64_t emu_conv_wgrad_slices(const int64_t* g) { return emu_k::conv_wgrad_slices(emu_geom(g)); }
#define EMU_CONV(T, S)                                                                                     \
  int emu_conv_forward_##S(const T* x, const T* w, const T* b, T* y, T* p, const int64_t* g) {            \
    return emu_k::conv_forward<T>(x, w, b, y, p, emu_geom(g), nullptr);                                    \
  }                                                                                                        \
  int emu_conv_backward_input_##S(const T* dy, const T* w, T* dx, T* p, const int64_t* g) {               \
    return emu_k::conv_backward_input<T>(dy, w, dx, p, emu_geom(g), nullptr);                              \
  }                                                                                                        \
  int emu_conv_backward_weight_##S(const T* dy, const T* x, T* part, T* acc, const int64_t* g, int bias,  \
                                   int64_t slices) {                                                       \
    return emu_k::conv_backward_weight<T>(dy, x, part, acc, emu_geom(g), bias != 0, slices, nullptr);      \
  }
EMU_CONV(float, f32)
EMU_CONV(double, f64)
static emu_k::PoolGeom emu_pool_geom(const int64_t* g) {
  return {g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11]};
}
int emu_max_pool_fwd_f32(const float* x, float* y, uint8_t* idx, const int64_t* g) {
  return emu_k::max_pool_fwd<float, uint8_t>(x, y, idx, emu_pool_geom(g), nullptr);
}
int emu_max_pool_bwd_f32(const float* grad, const uint8_t* idx, float* dx, const int64_t* g) {
  return emu_k::max_pool_bwd_gather<float, uint8_t>(grad, idx, dx, emu_pool_geom(g), nullptr);
}
}
"""


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    lib = build("layers/layers_cuda.cu", WRAPPERS, tmp_path_factory.mktemp("emu_layers"))
    for f in ("emu_conv_packed_elems", "emu_conv_wgrad_slices"):
        getattr(lib, f).restype = ctypes.c_int64
    lib.emu_conv_backward_weight_f32.argtypes = lib.emu_conv_backward_weight_f64.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int64,
    ]
    return lib


def _geom(x_shape, w_shape, padding):
    n, c, h, w = x_shape
    oc, _, kh, kw = w_shape
    ph, pw = padding
    g = [n, c, h, w, oc, kh, kw, ph, pw, h + 2 * ph - kh + 1, w + 2 * pw - kw + 1]
    return torch.tensor(g, dtype=torch.int64), g


class EmulatedConv:
    """conv2d forward, input gradient and weight gradient through the emulated CUDA launchers, with
    the scratch buffers the ATen glue (layers_cuda_glue.cpp) allocates."""

    def __init__(self, lib, x, weight, padding):
        self.lib, self.x, self.weight = lib, x.contiguous(), weight.contiguous()
        self.geom, g = _geom(x.shape, weight.shape, padding)
        self.out_shape = (g[0], g[4], g[9], g[10])
        self.sfx = {torch.float32: "f32", torch.float64: "f64"}[x.dtype]
        self.packed = torch.empty(lib.emu_conv_packed_elems(ptr(self.geom)), dtype=x.dtype)

    def forward(self, bias):
        y = torch.empty(self.out_shape, dtype=self.x.dtype)
        rc = getattr(self.lib, f"emu_conv_forward_{self.sfx}")(
            ptr(self.x), ptr(self.weight), ptr(bias), ptr(y), ptr(self.packed), ptr(self.geom)
        )
        assert rc == 0, rc
        return y

    def backward_input(self, dy):
        dx = torch.empty(self.x.shape, dtype=self.x.dtype)
        rc = getattr(self.lib, f"emu_conv_backward_input_{self.sfx}")(
            ptr(dy.contiguous()), ptr(self.weight), ptr(dx), ptr(self.packed), ptr(self.geom)
        )
        assert rc == 0, rc
        return dx

    def backward_weight(self, dy, bias: bool):
        oc, ckk = self.weight.shape[0], self.weight[0].numel()
        slices = self.lib.emu_conv_wgrad_slices(ptr(self.geom))
        partial = torch.empty(slices, oc * (ckk + bias), dtype=self.x.dtype)
        acc = torch.empty(oc, ckk + bias, dtype=self.x.dtype)
        rc = getattr(self.lib, f"emu_conv_backward_weight_{self.sfx}")(
            ptr(dy.contiguous()).value,
            ptr(self.x).value,
            ptr(partial).value,
            ptr(acc).value,
            ptr(self.geom).value,
            int(bias),
            slices,
        )
        assert rc == 0, rc
        return acc[:, :ckk].reshape(self.weight.shape), (acc[:, ckk] if bias else None), slices


# (x shape, weight shape, padding): LeNet's two convolutions; one output-channel tile of 4, of 8 and
# two of 16; channels that need several shared-memory chunks; a non-square kernel with unequal
# padding; padding wider than the kernel (the input gradient's logical padding goes negative).
CASES = {
    "lenet-conv1": ((3, 1, 28, 28), (6, 1, 5, 5), (2, 2)),
    "lenet-conv2": ((3, 6, 14, 14), (16, 6, 5, 5), (0, 0)),
    "oc3": ((2, 2, 9, 9), (3, 2, 3, 3), (1, 1)),
    "oc20-two-tiles": ((2, 3, 8, 8), (20, 3, 3, 3), (1, 1)),
    "c21-chunks": ((1, 21, 6, 6), (2, 21, 5, 5), (2, 2)),  # float64: 20 channels of weights per chunk
    "non-square": ((2, 2, 7, 12), (3, 2, 3, 5), (1, 2)),
    "wide-padding": ((2, 2, 4, 5), (4, 2, 2, 2), (3, 2)),
}


# Every case in float64 (errors ~1e-15: an indexing slip cannot hide); float32 on a few. The emulator
# runs one fiber per CUDA thread, so the cases are small.
@pytest.mark.parametrize(
    "case,dtype",
    [(c, torch.float64) for c in CASES] + [(c, torch.float32) for c in ("lenet-conv1", "non-square", "oc20-two-tiles")],
    ids=lambda v: v if isinstance(v, str) else str(v).replace("torch.", ""),
)
def test_emulated_cuda_conv_matches_aten(emu, case, dtype):
    x_shape, w_shape, padding = CASES[case]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, dtype=torch.float64, generator=gen)
    w = torch.randn(w_shape, dtype=torch.float64, generator=gen) / w_shape[1] ** 0.5
    b = torch.randn(w_shape[0], dtype=torch.float64, generator=gen)
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    ref = F.conv2d(xr, wr, br, padding=padding)
    dy = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    ref_dx, ref_dw, ref_db = torch.autograd.grad(ref, (xr, wr, br), dy)

    conv = EmulatedConv(emu, x.to(dtype), w.to(dtype), padding)
    y = conv.forward(b.to(dtype))
    dx = conv.backward_input(dy.to(dtype))
    dw, db, _ = conv.backward_weight(dy.to(dtype), bias=True)
    tol = dict(atol=1e-11, rtol=1e-11) if dtype == torch.float64 else dict(atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(y.double(), ref.detach(), **tol)
    torch.testing.assert_close(dx.double(), ref_dx, **tol)
    torch.testing.assert_close(dw.double(), ref_dw, **tol)
    torch.testing.assert_close(db.double(), ref_db, **tol)
    dw_nobias, db_nobias, _ = conv.backward_weight(dy.to(dtype), bias=False)
    assert db_nobias is None
    torch.testing.assert_close(dw_nobias.double(), ref_dw, **tol)


def test_emulated_weight_gradient_sums_several_slices_deterministically(emu):
    """conv1 at batch 3 has 2352 output positions: three slices of partial sums, then their column
    sums in slice order — the same bits on every run (no atomics)."""
    x_shape, w_shape, padding = CASES["lenet-conv1"]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(x_shape, generator=gen)
    w = torch.randn(w_shape, generator=gen)
    conv = EmulatedConv(emu, x, w, padding)
    dy = torch.randn(conv.out_shape, generator=gen)
    dw1, db1, slices = conv.backward_weight(dy, bias=True)
    dw2, db2, _ = conv.backward_weight(dy, bias=True)
    assert slices == 3
    assert torch.equal(dw1, dw2) and torch.equal(db1, db2)


def test_emulated_forward_without_bias(emu):
    x_shape, w_shape, padding = CASES["non-square"]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(x_shape, dtype=torch.float64, generator=gen)
    w = torch.randn(w_shape, dtype=torch.float64, generator=gen)
    y = EmulatedConv(emu, x, w, padding).forward(None)
    torch.testing.assert_close(y, F.conv2d(x, w, None, padding=padding), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(
    "window",
    [((2, 2), (2, 2), (0, 0)), ((3, 3), (1, 1), (1, 1)), ((3, 2), (2, 1), (1, 0))],
    ids=["lenet", "overlap", "non-square"],
)
def test_emulated_max_pool_32_bit_index_path_matches_aten(emu, window):
    """The pooling kernels' 32-bit index path (every LeNet call takes it) against ATen, ties and all."""
    (kh, kw), (sh, sw), (ph, pw) = window
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 9, 8, generator=gen).round()  # rounded: many ties, ATen's first-wins rule
    oh, ow = (9 + 2 * ph - kh) // sh + 1, (8 + 2 * pw - kw) // sw + 1
    g = torch.tensor([2, 3, 9, 8, kh, kw, sh, sw, ph, pw, oh, ow], dtype=torch.int64)
    y = torch.empty(2, 3, oh, ow)
    idx = torch.empty(2, 3, oh, ow, dtype=torch.uint8)
    assert emu.emu_max_pool_fwd_f32(ptr(x), ptr(y), ptr(idx), ptr(g)) == 0
    xr = x.clone().requires_grad_()
    ref = F.max_pool2d(xr, (kh, kw), (sh, sw), (ph, pw))
    assert torch.equal(y, ref.detach())
    dy = torch.randn(ref.shape, generator=gen)
    dx = torch.empty_like(x)
    assert emu.emu_max_pool_bwd_f32(ptr(dy), ptr(idx), ptr(dx), ptr(g)) == 0
    torch.testing.assert_close(dx, torch.autograd.grad(ref, xr, dy)[0], atol=1e-6, rtol=1e-6)


# ---- on a GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("layer", ["lenet-conv1", "lenet-conv2"])
def test_cuda_conv_at_batch_4096_matches_aten_and_is_deterministic(layer):
    from trainlab.ops.layers.layers_cpp import load

    load()
    x_shape, w_shape, padding = CASES[layer]
    x = torch.randn(4096, *x_shape[1:], device="cuda", dtype=torch.float64)
    w = torch.randn(w_shape, device="cuda", dtype=torch.float64) / w_shape[1] ** 0.5
    b = torch.randn(w_shape[0], device="cuda", dtype=torch.float64)
    y = torch.ops.trainlab.conv2d_fwd(x, w, b, list(padding))
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    ref = F.conv2d(xr, wr, br, padding=padding)
    dy = torch.randn_like(ref)
    ref_dx, ref_dw, ref_db = torch.autograd.grad(ref, (xr, wr, br), dy)
    torch.testing.assert_close(y, ref.detach(), atol=1e-10, rtol=1e-10)
    dx = torch.ops.trainlab.conv2d_bwd_input(dy, w, list(padding))
    torch.testing.assert_close(dx, ref_dx, atol=1e-10, rtol=1e-10)
    dw, db = torch.ops.trainlab.conv2d_bwd_weight(dy, x, w, list(padding), True)
    torch.testing.assert_close(dw, ref_dw, atol=1e-8, rtol=1e-10)
    torch.testing.assert_close(db, ref_db, atol=1e-8, rtol=1e-10)
    dw32, db32 = torch.ops.trainlab.conv2d_bwd_weight(dy.float(), x.float(), w.float(), list(padding), True)
    again = torch.ops.trainlab.conv2d_bwd_weight(dy.float(), x.float(), w.float(), list(padding), True)
    assert torch.equal(dw32, again[0]) and torch.equal(db32, again[1])


# ---- autograd of the C++/CUDA layer ops, in C++ ----------------------------------------------------


def test_conv_linear_relu_autograd_are_cpp_kernels():
    """The cpp/cuda rungs' conv2d, linear and relu carry their autograd formulas in C++ (no Python
    in the step's hot path); the Triton family keeps the Python ones, and the gradients are ATen's."""
    from trainlab.ops.conv2d import conv2d
    from trainlab.ops.layers.layers_cpp import load
    from trainlab.ops.linear import linear
    from trainlab.ops.relu import relu

    load()
    for op in ("conv2d_fwd", "linear_fwd", "relu_fwd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"trainlab::{op}", "Autograd"), op
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True)
    fc = torch.randn(5, 4 * 49, dtype=torch.float64, generator=gen, requires_grad=True)
    y = relu(conv2d(x, w, b, 0, impl="cpp"), impl="cpp")
    out = linear(y.flatten(1), fc, None, impl="cpp")
    assert "CppNode" in type(out.grad_fn).__name__ or "LinearFunction" in out.grad_fn.name(), out.grad_fn.name()
    ref = F.linear(F.relu(F.conv2d(x, w, b)).flatten(1), fc)
    g = torch.randn(out.shape, dtype=torch.float64, generator=gen)
    for got, want in zip(torch.autograd.grad(out, (x, w, b, fc), g), torch.autograd.grad(ref, (x, w, b, fc), g)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
