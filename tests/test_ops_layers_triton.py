"""The Triton rung. On CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set per test:
the rung reads it per call and the kernels avoid Triton's jit-compiled stdlib, so import order does
not matter); every kernel is also compiled ahead of time for sm_80 and sm_90 (fp32 and bf16) to PTX,
which needs no GPU. GPU tests run the compiled kernels and must pass, not skip, where a GPU exists.
"""

import pytest
import torch

pytest.importorskip("triton")

from conftest import skipped_by_design  # noqa: E402

from trainlab.ops import check  # noqa: E402
from trainlab.ops.kernel_check import ARCHS, triton_ptx  # noqa: E402

# Small shapes: the interpreter runs each program instance in NumPy.
CASES = [
    c
    for c in (
        check.CASES["conv2d"][1:4]
        + check.CASES["conv2d"][-1:]  # conv2d_relu: the ReLU epilogue and its backward
        + check.CASES["max_pool2d"][2:]
        + check.CASES["linear"][2:]
        + check.CASES["relu"][1:]
        + check.CASES["conv_relu_pool2d"][5:]  # ties, NaN, ±inf through the ReLU epilogue and the pool
    )
]


@pytest.fixture
def interpret(monkeypatch):
    """The device the Triton kernels run on: the GPU (compiled) where there is one, else the CPU
    under the interpreter. Tests that make their own tensors put them there."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return torch.device("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.op}-{c.name}")
def test_triton_matches_aten_within_tolerance(interpret, case, dtype):
    row = check.check_row(case, "triton", dtype, batch=2)
    if skipped_by_design(row, case, "triton", dtype):
        return
    assert row["ok"], row


def test_lenet_conv1_shape_with_split_k(interpret):
    # LeNet's first layer (padding 2, one input channel), batch 2: 1568 output pixels.
    row = check.check_row(check.CASES["conv2d"][0], "triton", torch.float32, batch=2)
    assert row["ok"], row


@pytest.mark.parametrize("op", check.OPS)
def test_gradcheck_and_opcheck(interpret, op):
    row = check.autograd_row(op, "triton")
    # the fused op's triton rung runs the three triton ops in sequence: no registered op of its own
    registered = "triton" in getattr(check.registry.module(op), "REGISTERED", ("triton",))
    assert row["gradcheck"] is True and row["opcheck"] is (True if registered else None), row["reason"]


def test_interpreter_env_is_read_per_call(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    from trainlab.errors import HardwareError
    from trainlab.ops.relu import relu

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert torch.equal(relu(torch.tensor([-1.0, 2.0]), impl="triton"), torch.tensor([0.0, 2.0]))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(HardwareError, match="TRITON_INTERPRET=1"):
        relu(torch.ones(3), impl="triton")


def test_split_k_geometry():
    from trainlab.ops.layers.layers_triton import _SPLIT_MULTIPLE, TUNING, _splits

    assert _splits(1000, 32, 4, interpreted=True) == (1, 1000)
    splits, per = _splits(256 * 784, _SPLIT_MULTIPLE, 5, interpreted=False)  # conv1's dW at batch 256
    assert per % _SPLIT_MULTIPLE == 0 and splits * per >= 256 * 784 and (splits - 1) * per < 256 * 784
    assert 50 <= splits * 5 <= 600  # fills an H100's 132 SMs a few times over, no more
    for name in ("_conv2d_bwd_weight_kernel", "_matmul_kernel"):  # every tuned slice holds whole BK tiles
        assert all(_SPLIT_MULTIPLE % meta["BK"] == 0 for meta, _, _ in TUNING[name][0]), name


def test_autotune_sets_compiled_several_interpreted_one(monkeypatch):
    """Compiled, each kernel is tuned over a small set that starts with the untuned config; its key is
    shape arguments of the kernel. Interpreted, one config (never benchmarked): tests pay nothing."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from trainlab.ops.gelu import gelu_triton
    from trainlab.ops.layers import layers_triton as lt

    monkeypatch.setattr(gelu_triton, "_kernels", {})
    assert set(lt.TUNING) == set(lt.KERNELS)
    for name, (configs, key, interpreted_meta) in lt.TUNING.items():
        compiled, interpreted = lt.tuned_kernel(name, False), lt.tuned_kernel(name, True)
        assert isinstance(compiled.fn, JITFunction) and isinstance(interpreted.fn, InterpretedFunction)
        assert 3 <= len(compiled.configs) <= 8 and len(interpreted.configs) == 1, name
        assert interpreted.configs[0].kwargs == interpreted_meta and set(interpreted_meta) == set(configs[0][0])
        assert set(key) <= set(compiled.arg_names), (name, key)
        for meta, warps, stages in configs:
            assert all(v & (v - 1) == 0 and v >= 16 for v in meta.values()), (name, meta)  # tl.dot / arange sizes
            assert warps in (1, 2, 4, 8) and 1 <= stages <= 4
        assert len({(tuple(sorted(m.items())), w, st) for m, w, st in configs}) == len(configs), name


@pytest.mark.parametrize("x_grad", [True, False], ids=["dx", "no-dx"])
@pytest.mark.parametrize("layer", ["conv", "linear"])
def test_fused_relu_epilogue_matches_aten_forward_and_backward(interpret, layer, x_grad):
    """relu(conv2d) and relu(linear) with the ReLU in the GEMM's epilogue, against autograd of ATen's
    unfused ops in float64: outputs, NaN kept, and the gradients of x, W and b — relu's backward kernel
    masks dy (a strided view) once, then the layer's backward kernels run on it."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from trainlab.ops.layers import layers_triton as lt

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    if layer == "conv":
        shapes, ref = ((2, 2, 5, 4), (3, 2, 3, 3)), lambda x, w, b: F.conv2d(x, w, b, padding=1)
        ours = lambda x, w, b: lt.conv2d_relu(x, w, b, [1, 1])  # noqa: E731
    else:
        shapes, ref = ((5, 9), (7, 9)), F.linear
        ours = lt.linear_relu
    x, w = (torch.randn(s, generator=g, dtype=torch.float64).to(interpret) for s in shapes)
    b = torch.randn(w.shape[0], generator=g, dtype=torch.float64).to(interpret)
    x.view(-1)[3] = float("nan")  # one NaN: relu keeps it, as torch.relu does
    leaves = [t.clone().requires_grad_(x_grad or i > 0) for i, t in enumerate((x, w, b))]
    ref_leaves = [t.clone().requires_grad_(x_grad or i > 0) for i, t in enumerate((x, w, b))]
    y, y_ref = ours(*leaves), torch.relu(ref(*ref_leaves))
    torch.testing.assert_close(y, y_ref, equal_nan=True)
    assert (y == 0).any() and (y > 0).any() and torch.isnan(y).any()  # both sides of the ReLU, and a NaN
    dy = torch.randn(*y.shape[:-1], 2 * y.shape[-1], generator=g, dtype=torch.float64).to(interpret)[..., ::2]
    wanted = [t for t in leaves if t.requires_grad]
    with Ops() as ops:
        grads = torch.autograd.grad(y, wanted, dy)
    ref_grads = torch.autograd.grad(y_ref, [t for t in ref_leaves if t.requires_grad], dy)
    for ours_g, ref_g in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(ours_g, ref_g, equal_nan=True)
    launched = {name.removeprefix("trainlab.") for name in ops.names if name.startswith("trainlab.")}
    bwd = (
        {"triton_linear_bwd"}
        if layer == "linear"
        else {"triton_conv2d_bwd_weight"} | ({"triton_conv2d_bwd_input"} if x_grad else set())
    )
    assert launched == bwd | {"triton_relu_bwd"}, launched  # dy masked once, by relu's backward


@pytest.mark.parametrize("layer", ["conv", "linear"])
def test_every_output_element_is_stored_by_a_kernel(interpret, monkeypatch, layer):
    """The GEMM outputs and the split-K partial sums are allocated without a fill: a fresh tensor here
    is all NaN, so an element no program stores would come out NaN (ATen's forward and gradients
    have none)."""
    import torch.nn.functional as F

    from trainlab.ops.layers import layers_triton as lt

    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
    g = torch.Generator().manual_seed(1)
    # more than one row tile and one column tile (the interpreter's: 128 rows, 64 columns) in every GEMM
    if layer == "conv":  # 162 output pixels; the weight gradient has 8 * 9 + 1 = 73 columns
        shapes, ref = ((2, 8, 9, 9), (3, 8, 3, 3)), lambda x, w, b: F.conv2d(x, w, b, padding=1)
        ours = lambda x, w, b: lt.conv2d(x, w, b, [1, 1])  # noqa: E731
    else:  # 150 rows, 70 output features
        shapes, ref, ours = ((150, 9), (70, 9)), F.linear, lt.linear
    leaves = [torch.randn(s, generator=g, dtype=torch.float64).to(interpret).requires_grad_() for s in shapes]
    leaves.append(torch.randn(shapes[1][0], generator=g, dtype=torch.float64).to(interpret).requires_grad_())
    y, y_ref = ours(*leaves), ref(*leaves)
    torch.testing.assert_close(y, y_ref)
    dy = torch.randn(y.shape, generator=g, dtype=torch.float64).to(interpret)
    for got, want in zip(torch.autograd.grad(y, leaves, dy), torch.autograd.grad(y_ref, leaves, dy), strict=True):
        torch.testing.assert_close(got, want)


def test_fused_relu_ops_pass_opcheck(interpret):
    from trainlab.ops.layers import layers_triton  # noqa: F401 - registers the ops

    g = torch.Generator().manual_seed(1)
    x, w, b = (torch.randn(s, generator=g).to(interpret) for s in ((1, 2, 4, 4), (3, 2, 3, 3), (3,)))
    torch.library.opcheck(torch.ops.trainlab.triton_conv2d_relu_fwd, (x.requires_grad_(), w, b, [1, 1]))
    x, w, b = (torch.randn(s, generator=g).to(interpret) for s in ((4, 6), (5, 6), (5,)))
    torch.library.opcheck(torch.ops.trainlab.triton_linear_relu_fwd, (x, w.requires_grad_(), b))


# ---- ahead-of-time compilation: every kernel, sm_80 and sm_90 ---------------------------------------


@pytest.fixture(scope="session")
def ptx():
    """{(kernel, dtype, arch): PTX}, compiled once per session (Triton also caches them on disk)."""
    from trainlab.ops.layers import layers_triton

    out = {}
    for dtype, archs in (("fp32", ARCHS), ("bf16", (90,))):
        for name, (sig, consts) in layers_triton.aot_specs(dtype).items():
            for arch in archs:
                out[(name, dtype, arch)] = triton_ptx(getattr(layers_triton, name), sig, consts, arch)
    return out


def test_every_kernel_compiles_for_sm80_and_sm90(ptx):
    from trainlab.ops.layers.layers_triton import KERNELS

    for name in KERNELS:
        for arch in ARCHS:
            code = ptx[(name, "fp32", arch)]
            assert f".target sm_{arch}" in code and ".entry" in code, (name, arch)


def test_fp32_gemms_with_tf32_use_tf32_tensor_cores():
    # IEEE False (torch's TF32 switch on for the layer's ATen op): the products are TF32 mma, no FMA loop.
    from trainlab.ops.layers import layers_triton

    for name in ("_conv2d_fwd_kernel", "_conv2d_bwd_weight_kernel", "_matmul_kernel"):
        sig, consts = layers_triton.aot_specs("fp32")[name]
        code = triton_ptx(getattr(layers_triton, name), sig, {**consts, "IEEE": False}, 90)
        assert ".f32.tf32.tf32" in code and "fma.rn.f32" not in code, name


def test_bf16_gemms_use_tensor_cores_and_fp32_does_not(ptx):
    # bf16 tl.dot -> mma instructions; float32 with input_precision="ieee" -> plain FMAs (no TF32),
    # which is what lets the check hold float32 results to float32 tolerances.
    for name in ("_conv2d_fwd_kernel", "_conv2d_bwd_weight_kernel", "_matmul_kernel"):
        assert "mma" in ptx[(name, "bf16", 90)], name
        assert "mma" not in ptx[(name, "fp32", 90)] and "fma.rn.f32" in ptx[(name, "fp32", 90)], name


def test_float32_products_follow_torchs_tf32_switches(monkeypatch):
    """Compiled (the launch intercepted, so no GPU is needed), a float32 convolution's products are TF32
    exactly when cuDNN's switch allows it and a linear layer's when cuBLAS's does, as ATen's ops of the
    same layers; bf16 never asks for IEEE; interpreted, float32 is always IEEE; `ops check` turns both off."""
    from trainlab.device import ieee_float32
    from trainlab.ops.layers import layers_triton as lt

    seen = []
    monkeypatch.setattr(lt, "_launch", lambda name, interpreted, grid, *a, **meta: seen.append((name, meta["IEEE"])))
    monkeypatch.setattr(lt, "run_mode", lambda x, interpret=None: False)
    x, w, b = torch.randn(2, 1, 6, 6), torch.randn(3, 1, 3, 3), torch.randn(3)

    def ieee_of(dtype, conv_tf32, matmul_tf32):
        seen.clear()
        torch.backends.cudnn.allow_tf32 = conv_tf32
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
        lt.conv2d_fwd(x.to(dtype), w.to(dtype), b.to(dtype), [1, 1])
        lt.conv2d_bwd_weight(torch.randn(2, 3, 6, 6, dtype=dtype), x.to(dtype), w.to(dtype), [1, 1], True)
        lt.linear_fwd(x.reshape(2, -1).to(dtype), torch.randn(4, 36, dtype=dtype), None)
        return dict(seen)

    conv, wgrad, mm = "_conv2d_fwd_kernel", "_conv2d_bwd_weight_kernel", "_matmul_kernel"
    with ieee_float32():  # restores the switches the test sets
        assert ieee_of(torch.float32, True, False) == {conv: False, wgrad: False, mm: True}  # torch's defaults
        assert ieee_of(torch.float32, False, True) == {conv: True, wgrad: True, mm: False}
        assert ieee_of(torch.bfloat16, False, False) == {conv: False, wgrad: False, mm: False}
        torch.backends.cudnn.allow_tf32 = True
        seen_in_check = []
        check._guarded(check._new_row(), "aten", lambda row, dev: seen_in_check.append(torch.backends.cudnn.allow_tf32))
        assert seen_in_check == [False] and torch.backends.cudnn.allow_tf32  # off inside the check, restored after
    assert lt._precision(torch.float32, True, True)["IEEE"]  # the interpreter: IEEE whatever the switches


# ---- compiled on a GPU -----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", [c for cases in check.CASES.values() for c in cases], ids=lambda c: f"{c.op}-{c.name}")
def test_compiled_kernels_match_aten_on_gpu(case, dtype):
    row = check.check_row(case, "triton", dtype, batch=64)
    if skipped_by_design(row, case, "triton", dtype):
        return
    assert row["ok"] and row["mode"] == "compiled", row
