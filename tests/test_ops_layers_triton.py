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
        check.CASES["conv2d"][1:4] + check.CASES["max_pool2d"][2:] + check.CASES["linear"][2:] + check.CASES["relu"][1:]
    )
]


@pytest.fixture
def interpret(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")


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
    from trainlab.ops.layers.layers_triton import _splits

    assert _splits(1000, 32, 4, interpreted=True) == (1, 1000)
    splits, per = _splits(256 * 784, 32, 5, interpreted=False)  # conv1's dW at batch 256
    assert per % 32 == 0 and splits * per >= 256 * 784 and (splits - 1) * per < 256 * 784
    assert 50 <= splits * 5 <= 600  # fills an H100's 132 SMs a few times over, no more


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


def test_bf16_gemms_use_tensor_cores_and_fp32_does_not(ptx):
    # bf16 tl.dot -> mma instructions; float32 with input_precision="ieee" -> plain FMAs (no TF32),
    # which is what lets the check hold float32 results to float32 tolerances.
    for name in ("_conv2d_fwd_kernel", "_conv2d_bwd_weight_kernel", "_matmul_kernel"):
        assert "mma" in ptx[(name, "bf16", 90)], name
        assert "mma" not in ptx[(name, "fp32", 90)] and "fma.rn.f32" in ptx[(name, "fp32", 90)], name


# ---- compiled on a GPU -----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", [c for cases in check.CASES.values() for c in cases], ids=lambda c: f"{c.op}-{c.name}")
def test_compiled_kernels_match_aten_on_gpu(case, dtype):
    row = check.check_row(case, "triton", dtype, batch=64)
    if skipped_by_design(row, case, "triton", dtype):
        return
    assert row["ok"] and row["mode"] == "compiled", row
