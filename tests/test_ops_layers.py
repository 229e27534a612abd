"""Our conv2d / max_pool2d / linear / relu, python and cpp rungs, against ATen.

Every shape case of `trainlab ops check` (LeNet-5's layers, batch 1, non-square, overlapping
windows, strided inputs, NaN/inf/ties) runs in float32 and bfloat16 with the check's stated
tolerances; gradcheck in float64; opcheck of the registered C++ ops; torch.compile traces through
them; bad arguments are one OpInputError. The first test in a fresh cache builds the C++
extension (~30-60 s on 2 cores; cached afterwards under $TRAINLAB_CACHE).
"""

import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import load_ext, skipped_by_design

from trainlab.errors import ConfigError, HardwareError, UserError
from trainlab.ops import check
from trainlab.ops.conv2d import Conv2d, conv2d
from trainlab.ops.layers.layer_args import OpInputError
from trainlab.ops.linear import Linear, linear
from trainlab.ops.max_pool2d import MaxPool2d, max_pool2d
from trainlab.ops.relu import ReLU, relu

ALL_CASES = [case for op, cases in check.CASES.items() if op != "gelu" for case in cases]  # GELU's: test_gelu*


@pytest.fixture(scope="module")
def ext():
    from trainlab.ops.layers.layers_cpp import load

    return load_ext(load)  # skips without a compiler on a CPU machine, fails on a GPU machine


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: f"{c.op}-{c.name}")
@pytest.mark.parametrize("impl", ["python", "cpp"])
def test_rung_matches_aten_within_tolerance(ext, impl, case, dtype):
    row = check.check_row(case, impl, dtype, batch=4)
    if skipped_by_design(row, case, impl, dtype):
        return
    assert row["ok"], row
    assert row["worst_ratio_to_tol"] <= 1.0
    if case.op == "relu" or (
        case.op == "max_pool2d" and case.name in ("lenet-pool1", "lenet-pool2", "strided-input", "nan-inf-ties")
    ):
        # selections without overlapping windows are exact in any dtype: same values, same routing
        assert row["fwd_max_abs_err"] == 0 and row["grad_max_abs_err"] == 0 and row["fwd_vs_aten"] == 0


def test_tolerance_catches_a_wrong_kernel(ext, monkeypatch):
    """The check can fail: a backward that forgets the bias gradient is far outside tolerance."""
    from trainlab.ops import conv2d as conv

    real = conv.Conv2dFunction.backward

    def broken(ctx, grad):
        dx, dw, db, none = real(ctx, grad)
        return dx, dw, None if db is None else db * 0.5, none

    monkeypatch.setattr(conv.Conv2dFunction, "backward", staticmethod(broken))
    row = check.check_row(check.CASES["conv2d"][0], "python", torch.float32, batch=2)
    assert not row["ok"] and row["worst_ratio_to_tol"] > 100


@pytest.mark.parametrize("op", check.OPS)
@pytest.mark.parametrize("impl", ["python", "cpp"])
def test_gradcheck_and_opcheck(ext, op, impl):
    row = check.autograd_row(op, impl)
    assert row["gradcheck"] is True, row
    assert row["opcheck"] is (True if impl == "cpp" else None), row


def test_pool_ties_nan_and_all_inf_windows_route_like_aten(ext):
    x = torch.tensor(
        [
            [
                [
                    [1.0, 1.0, math.nan, 2.0],
                    [1.0, 1.0, 2.0, math.nan],
                    [-math.inf, -math.inf, 3.0, 3.0],
                    [-math.inf, -math.inf, 3.0, 3.0],
                ]
            ]
        ],
        requires_grad=True,
    )
    g = torch.arange(1.0, 5.0).view(1, 1, 2, 2)
    ref = torch.autograd.grad(F.max_pool2d(x, 2), x, g)[0]
    for impl in ("python", "cpp"):
        y = max_pool2d(x, 2, impl=impl)
        assert torch.equal(torch.isnan(y), torch.isnan(F.max_pool2d(x, 2)))
        assert torch.equal(torch.autograd.grad(y, x, g)[0], ref), (
            impl
        )  # first max wins, the last NaN wins, -inf → first


def test_pool_saves_one_byte_per_output(ext):
    _, idx = torch.ops.trainlab.max_pool2d_fwd(torch.randn(2, 3, 8, 8), [2, 2], [2, 2], [0, 0])
    assert idx.dtype == torch.uint8 and idx.max() <= 3
    _, big = torch.ops.trainlab.max_pool2d_fwd(torch.randn(1, 1, 17, 17), [17, 17], [1, 1], [0, 0])
    assert big.dtype == torch.int32  # windows above 256 elements need a wider index


def test_conv_batch_beyond_one_chunk_matches_aten(ext):
    # More samples than one cache-sized chunk (17 forward, 15 weight-gradient for conv2): the chunk
    # loop, the last partial chunk and the weight gradient accumulated across chunks, at tolerance.
    case = check.CASES["conv2d"][1]  # lenet-conv2
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
    (
        lambda impl: conv2d(torch.zeros(1, 1, 8, 8, dtype=torch.long), torch.zeros(2, 1, 3, 3), impl=impl),
        "integer tensor",
    ),
    (lambda impl: conv2d(torch.zeros(1, 8, 8), torch.zeros(2, 1, 3, 3), impl=impl), "must be 4-D"),
    (
        lambda impl: conv2d(torch.zeros(1, 3, 8, 8), torch.zeros(2, 1, 3, 3), impl=impl),
        "3 channels but weight expects 1",
    ),
    (
        lambda impl: conv2d(torch.zeros(1, 1, 4, 4), torch.zeros(2, 1, 5, 5), impl=impl),
        "kernel 5x5 is larger than the input 4x4",
    ),
    (
        lambda impl: conv2d(torch.zeros(1, 1, 8, 8), torch.zeros(2, 1, 3, 3, dtype=torch.float64), impl=impl),
        "use one dtype",
    ),
    (
        lambda impl: conv2d(torch.zeros(1, 1, 8, 8), torch.zeros(2, 1, 3, 3), torch.zeros(3), impl=impl),
        "bias has 3 entries",
    ),
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
        torch.ops.trainlab.max_pool2d_bwd(
            torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2, dtype=torch.long), [4, 4], [2, 2], [2, 2], [0, 0]
        )


# ---- the fused first stage (conv2d → relu → 2x2 max/avg pool, ops/conv_relu_pool2d/conv_relu_pool_cpu.cpp) ------


def _fused_inputs(n, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, 1, 28, 28, generator=g, dtype=dtype),
        torch.randn(6, 1, 5, 5, generator=g, dtype=dtype) * 0.2,
        torch.randn(6, generator=g, dtype=dtype) * 0.1,
    )


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_fused_stage_matches_aten_across_chunks_and_layouts(ext, pool):
    """37 samples (not a multiple of the kernel's 8-sample gradient chunks), NCHW and channels-last
    input: the output, its layout and every gradient match the ATen composition in float64 (average
    pooling: every element whose ReLU passed gets a quarter of dy)."""
    from trainlab.ops.conv_relu_pool2d import conv_relu_pool2d

    pool2d = F.avg_pool2d if pool == "avg" else F.max_pool2d
    x, w, b = _fused_inputs(37)
    for channels_last in (None, 0, 1):  # NCHW; x channels-last; the weight channels-last
        # .to restrides a one-channel tensor (.contiguous(channels_last) would keep its strides)
        leaves = [
            (t.to(memory_format=torch.channels_last) if i == channels_last else t.clone()).requires_grad_()
            for i, t in enumerate((x, w, b))
        ]
        ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
        out = conv_relu_pool2d(*leaves, 2, impl="cpp", pool=pool)
        ref = pool2d(F.relu(F.conv2d(*ref_leaves, padding=2)), 2)
        assert out.shape == (37, 6, 14, 14)
        if channels_last is None:
            assert out.is_contiguous() and ref.is_contiguous()
        else:  # as ATen's conv: channels-last when the input or the weight is
            assert out.stride(1) == 1 and ref.stride(1) == 1 and out.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
        dy = torch.randn_like(ref)
        for mine, theirs in zip(torch.autograd.grad(out, leaves, dy), torch.autograd.grad(ref, ref_leaves, dy)):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-11)


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_fused_stage_weight_gradient_does_not_depend_on_the_thread_count(ext, pool):
    """dW and db are summed per fixed chunk of samples and the chunks added in order: bit-identical
    with 1 and 2 threads (the same seed gives the same training curve on any CPU thread count)."""
    from trainlab.ops.conv_relu_pool2d import conv_relu_pool2d

    x, w, b = _fused_inputs(96, seed=1, dtype=torch.float32)
    threads = torch.get_num_threads()
    grads = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            wl, bl = w.clone().requires_grad_(), b.clone().requires_grad_()
            out = conv_relu_pool2d(x, wl, bl, 2, impl="cpp", pool=pool)
            grads.append(torch.autograd.grad(out, (wl, bl), torch.ones_like(out)))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, c) for a, c in zip(*grads))
    assert grads[0][0].abs().sum() > 0  # a real gradient, not two zeros


def test_fused_stage_saves_the_input_and_one_byte_per_output(ext):
    from trainlab.ops.conv_relu_pool2d import conv_relu_pool2d

    x, w, b = _fused_inputs(4, dtype=torch.float32)
    w.requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        conv_relu_pool2d(x, w, b, 2, impl="cpp")
    codes = [t for t in saved if t.dtype == torch.uint8]
    assert len(codes) == 1 and codes[0].shape == (4, 6, 14, 14)
    assert {t.data_ptr() for t in saved} >= {x.data_ptr()}  # the input itself, not a copy or the conv output


def test_fused_stage_traces_under_torch_compile(ext):
    from trainlab.ops.conv_relu_pool2d import ConvReluPool2d

    torch.manual_seed(0)
    layer = ConvReluPool2d(1, 6, 5, padding=2, impl="cpp")
    x = torch.randn(3, 1, 28, 28)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), layer(x))
    torch.testing.assert_close(
        layer(x),
        F.max_pool2d(F.relu(nn.functional.conv2d(x, layer.weight, layer.bias, padding=2)), 2),
        rtol=1e-5,
        atol=1e-5,
    )


def test_fused_stage_bad_input_is_one_line():
    from trainlab.ops.conv_relu_pool2d import conv_relu_pool2d

    with pytest.raises(OpInputError, match=r"convolution output is 1x1, smaller than the 2x2 pooling window"):
        conv_relu_pool2d(torch.randn(1, 1, 3, 3), torch.randn(2, 1, 3, 3), None, 0, impl="python")
    with pytest.raises(OpInputError, match=r"impl='cpp': the fused kernel runs on the CPU, the input is on meta"):
        conv_relu_pool2d(
            torch.randn(1, 1, 8, 8, device="meta"), torch.randn(2, 1, 3, 3, device="meta"), None, 0, impl="cpp"
        )
    with pytest.raises(OpInputError, match="x has 2 channels but weight expects 1"):
        conv_relu_pool2d(torch.randn(1, 2, 8, 8), torch.randn(2, 1, 3, 3), None, 0, impl="cpp")
    x, w = torch.randn(1, 1, 8, 8), torch.randn(2, 1, 3, 3)
    with pytest.raises(OpInputError, match=r"^conv_relu_pool2d pool='min': expected 'max' or 'avg'$"):
        conv_relu_pool2d(x, w, None, 0, impl="cpp", pool="min")
    with pytest.raises(
        OpInputError, match=r"^conv_relu_pool2d impl='python': average pooling runs on aten and cpp only$"
    ):
        conv_relu_pool2d(x, w, None, 0, impl="python", pool="avg")


def test_fused_average_pool_op_passes_opcheck(ext):
    """The C++ op's schema with avg=True (fakes, autograd registration, the schema's `bool avg`) under
    torch.library.opcheck, as `ops check` runs it for the max-pool form."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.trainlab.conv_relu_pool2d_fwd, (x, w, b, [1, 0], True))


def test_the_walkthrough_commands_for_the_fused_stage_run(ext, tmp_path, capsys):
    """`trainlab ops check --op conv_relu_pool2d` and the stage1 bench of the walkthrough, from the CLI
    (rungs and budget cut down: the same subcommands and flags)."""
    from trainlab.cli import main

    assert (
        main(
            [
                "ops",
                "check",
                "--op",
                "conv_relu_pool2d",
                "--impl",
                "aten",
                "--impl",
                "cpp",
                "--dtype",
                "float32",
                "--case",
                "lenet-stage1",
            ]
        )
        == 0
    )
    assert "all ok" in capsys.readouterr().out
    assert (
        main(
            [
                "ops",
                "bench",
                "--device",
                "cpu",
                "--threads",
                "1",
                "--layer",
                "conv1",
                "--layer",
                "relu1",
                "--layer",
                "pool1",
                "--layer",
                "stage1",
                "--batch",
                "256",
                "--impl",
                "cpp",
                "--budget",
                "0.05",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    rows = json.loads((tmp_path / "ops_bench.json").read_text())["rows"]
    assert {(r["layer"], r["impl"]) for r in rows} >= {("stage1", "aten"), ("stage1", "cpp")}
