"""Our conv2d / max_pool2d / linear / relu, python and cpp rungs, against ATen.

Every shape case of `trainlab ops check` (LeNet-5's layers, batch 1, non-square, overlapping
windows, strided inputs, NaN/inf/ties) runs in float32 and bfloat16 with the check's stated
tolerances; gradcheck in float64; opcheck of the registered C++ ops; torch.compile traces through
them; bad arguments are one OpInputError. The first test in a fresh cache builds the C++
extension (~30-60 s on 2 cores; cached afterwards under $TRAINLAB_CACHE).
"""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import load_ext
from trainlab.errors import ConfigError, HardwareError, UserError
from trainlab.ops import check
from trainlab.ops.conv import Conv2d, conv2d
from trainlab.ops.layer_args import OpInputError
from trainlab.ops.linear import Linear, linear
from trainlab.ops.pool import MaxPool2d, max_pool2d
from trainlab.ops.relu import ReLU, relu

ALL_CASES = [case for cases in check.CASES.values() for case in cases]


@pytest.fixture(scope="module")
def ext():
    from trainlab.ops.layers_cpp import load

    return load_ext(load)   # skips without a compiler on a CPU machine, fails on a GPU machine


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: f"{c.op}-{c.name}")
@pytest.mark.parametrize("impl", ["python", "cpp"])
def test_rung_matches_aten_within_tolerance(ext, impl, case, dtype):
    row = check.check_row(case, impl, dtype, batch=4)
    assert row["ok"], row
    assert row["worst_ratio_to_tol"] <= 1.0
    if case.op == "relu" or (case.op == "max_pool2d" and case.name in ("lenet-pool1", "lenet-pool2", "strided-input",
                                                                        "nan-inf-ties")):
        # selections without overlapping windows are exact in any dtype: same values, same routing
        assert row["fwd_max_abs_err"] == 0 and row["grad_max_abs_err"] == 0 and row["fwd_vs_aten"] == 0


def test_tolerance_catches_a_wrong_kernel(ext, monkeypatch):
    """The check can fail: a backward that forgets the bias gradient is far outside tolerance."""
    from trainlab.ops import conv

    real = conv.Conv2dFunction.backward

    def broken(ctx, grad):
        dx, dw, db, none = real(ctx, grad)
        return dx, dw, None if db is None else db * 0.5, none

    monkeypatch.setattr(conv.Conv2dFunction, "backward", staticmethod(broken))
    row = check.check_row(check.CASES["conv2d"][0], "python", torch.float32, batch=2)
    assert not row["ok"] and row["worst_ratio_to_tol"] > 100


@pytest.mark.parametrize("op", tuple(check.LAYER_OPS))
@pytest.mark.parametrize("impl", ["python", "cpp"])
def test_gradcheck_and_opcheck(ext, op, impl):
    row = check.autograd_row(op, impl)
    assert row["gradcheck"] is True, row
    assert row["opcheck"] is (True if impl == "cpp" else None), row


def test_pool_ties_nan_and_all_inf_windows_route_like_aten(ext):
    x = torch.tensor([[[[1.0, 1.0, math.nan, 2.0], [1.0, 1.0, 2.0, math.nan],
                        [-math.inf, -math.inf, 3.0, 3.0], [-math.inf, -math.inf, 3.0, 3.0]]]], requires_grad=True)
    g = torch.arange(1.0, 5.0).view(1, 1, 2, 2)
    ref = torch.autograd.grad(F.max_pool2d(x, 2), x, g)[0]
    for impl in ("python", "cpp"):
        y = max_pool2d(x, 2, impl=impl)
        assert torch.equal(torch.isnan(y), torch.isnan(F.max_pool2d(x, 2)))
        assert torch.equal(torch.autograd.grad(y, x, g)[0], ref), impl   # first max wins, the last NaN wins, -inf → first


def test_pool_saves_one_byte_per_output(ext):
    _, idx = torch.ops.trainlab.max_pool2d_fwd(torch.randn(2, 3, 8, 8), [2, 2], [2, 2], [0, 0])
    assert idx.dtype == torch.uint8 and idx.max() <= 3
    _, big = torch.ops.trainlab.max_pool2d_fwd(torch.randn(1, 1, 17, 17), [17, 17], [1, 1], [0, 0])
    assert big.dtype == torch.int32   # windows above 256 elements need a wider index


def test_conv_batch_beyond_one_chunk_matches_aten(ext):
    # More samples than one cache-sized chunk (17 forward, 15 weight-gradient for conv2): the chunk
    # loop, the last partial chunk and the weight gradient accumulated across chunks, at tolerance.
    case = check.CASES["conv2d"][1]   # lenet-conv2
    row = check.check_row(case, "cpp", torch.float32, batch=70)
    assert row["ok"] and row["worst_ratio_to_tol"] < 0.5, row


def test_first_layer_input_gradient_is_not_computed(ext):
    """conv1's input is data: the autograd formula must not run conv2d_bwd_input for it."""
    x = torch.randn(2, 1, 8, 8)
    w = torch.randn(3, 1, 3, 3, requires_grad=True)
    with torch.profiler.profile() as prof:
        conv2d(x, w, None, 1, impl="cpp").sum().backward()
    names = {e.name for e in prof.events()}
    assert "trainlab::conv2d_bwd_weight" in names and "trainlab::conv2d_bwd_input" not in names


def test_torch_compile_fullgraph_traces_the_cpp_ops(ext):
    torch._dynamo.reset()
    model = nn.Sequential(Conv2d(1, 4, 3, padding=1), ReLU(), MaxPool2d(2), nn.Flatten(), Linear(4 * 4 * 4, 5))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 1, 8, 8)
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, model(x))
    assert all(p.grad is not None for p in model.parameters())


def test_modules_start_from_the_same_weights_as_torch_nn():
    torch.manual_seed(5)
    ref = [nn.Conv2d(3, 4, 5, padding=2), nn.Linear(10, 7)]
    torch.manual_seed(5)
    ours = [Conv2d(3, 4, 5, padding=2, impl="python"), Linear(10, 7, impl="python")]
    for a, b in zip(ref, ours):
        assert a.state_dict().keys() == b.state_dict().keys()
        assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


# ---- bad input: one clear error, the same from every rung ------------------------------------------------

BAD = [
    (lambda impl: conv2d(torch.zeros(1, 1, 8, 8, dtype=torch.long), torch.zeros(2, 1, 3, 3), impl=impl), "integer tensor"),
    (lambda impl: conv2d(torch.zeros(1, 8, 8), torch.zeros(2, 1, 3, 3), impl=impl), "must be 4-D"),
    (lambda impl: conv2d(torch.zeros(1, 3, 8, 8), torch.zeros(2, 1, 3, 3), impl=impl), "3 channels but weight expects 1"),
    (lambda impl: conv2d(torch.zeros(1, 1, 4, 4), torch.zeros(2, 1, 5, 5), impl=impl), "kernel 5x5 is larger than the input 4x4"),
    (lambda impl: conv2d(torch.zeros(1, 1, 8, 8), torch.zeros(2, 1, 3, 3, dtype=torch.float64), impl=impl), "use one dtype"),
    (lambda impl: conv2d(torch.zeros(1, 1, 8, 8), torch.zeros(2, 1, 3, 3), torch.zeros(3), impl=impl), "bias has 3 entries"),
    (lambda impl: conv2d(torch.zeros(1, 1, 8, 8), torch.zeros(2, 1, 3, 3), padding=-1, impl=impl), "padding must be"),
    (lambda impl: max_pool2d(torch.zeros(1, 1, 3, 3), 4, impl=impl), "kernel 4x4 is larger than the input 3x3"),
    (lambda impl: max_pool2d(torch.zeros(1, 1, 8, 8), 2, padding=2, impl=impl), "at most half the kernel"),
    (lambda impl: max_pool2d(torch.zeros(8, 8), 2, impl=impl), "must be 4-D"),
    (lambda impl: max_pool2d(torch.zeros(1, 1, 8, 8, dtype=torch.bool), 2, impl=impl), "boolean tensor"),
    (lambda impl: max_pool2d(torch.zeros(1, 1, 8, 8), 0, impl=impl), "kernel_size must be"),
    (lambda impl: linear(torch.zeros(2, 3, 4), torch.zeros(5, 4), impl=impl), "must be 2-D"),
    (lambda impl: linear(torch.zeros(2, 3), torch.zeros(5, 4), impl=impl), "3 features but weight expects 4"),
    (lambda impl: relu(torch.zeros(3, dtype=torch.int32), impl=impl), "integer tensor"),
]


@pytest.mark.parametrize("impl", ["aten", "python", "cpp", "triton", "cuda"])
@pytest.mark.parametrize("call,message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_one_clear_error_from_every_rung(call, message, impl):
    with pytest.raises(OpInputError, match=message) as e:
        call(impl)
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)
    assert "\n" not in str(e.value)


def test_unknown_impl_and_impl_on_the_wrong_device():
    with pytest.raises(ConfigError, match="unknown implementation"):
        relu(torch.zeros(3), impl="fortran")
    with pytest.raises(ConfigError, match="unknown implementation"):
        Conv2d(1, 2, 3, impl="fortran")
    if not torch.cuda.is_available():
        with pytest.raises(HardwareError, match="impl='cuda'.*no CUDA GPU"):
            relu(torch.zeros(3), impl="cuda")


def test_direct_op_calls_are_checked_in_cpp_too(ext):
    with pytest.raises(RuntimeError, match="x has 3 channels, weight expects 1"):
        torch.ops.trainlab.conv2d_fwd(torch.zeros(1, 3, 8, 8), torch.zeros(2, 1, 3, 3), None, [0, 0])
    with pytest.raises(RuntimeError, match="indices must be Byte"):
        torch.ops.trainlab.max_pool2d_bwd(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2, dtype=torch.long),
                                          [4, 4], [2, 2], [2, 2], [0, 0])
