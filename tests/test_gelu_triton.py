"""Triton GELU kernels. On CPU they run under Triton's interpreter (TRITON_INTERPRET=1, set per
test with monkeypatch so nothing leaks into other tests; our wrapper reads the variable per call and
wraps the kernels in InterpretedFunction itself, so import order does not matter)."""

import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from trainlab.ops.gelu import gelu  # noqa: E402

APPROX = ["none", "tanh"]
TOL = {torch.float64: (1e-13, 1e-12), torch.float32: (2e-6, 2e-6), torch.bfloat16: (1e-5, 2.0**-7)}


@pytest.fixture
def interpret(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def _x(n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64) * 3).to(dtype)


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_fwd_bwd_match_float64_reference(interpret, dtype, approximate):
    atol, rtol = TOL[dtype]
    x = _x(10007, dtype).to(_device()).requires_grad_()  # not a multiple of the block: masked tail
    g = torch.randn_like(x)
    y = gelu(x, impl="triton", approximate=approximate)
    y.backward(g)
    xr = x.detach().double().requires_grad_()
    F.gelu(xr, approximate=approximate).backward(g.double())
    torch.testing.assert_close(y.double(), F.gelu(xr.detach(), approximate=approximate), atol=atol, rtol=rtol)
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=atol * float(g.abs().max()), rtol=rtol)


@pytest.mark.parametrize("approximate", APPROX)
def test_bf16_rounds_to_nearest_even_like_aten(interpret, approximate):
    # Triton 3.9's interpreter truncates float32 -> bf16; the kernel rounds by hand. With truncation
    # ~50 % of outputs would differ from ATen; with RNE only values at rounding boundaries do.
    x = _x(20000, torch.bfloat16).to(_device())
    y = gelu(x, impl="triton", approximate=approximate)
    ref = F.gelu(x, approximate=approximate)
    big = ref.abs() > 1e-3
    assert (y[big] != ref[big]).float().mean() < 0.1
    assert torch.equal(
        torch.isnan(gelu(torch.tensor([math.nan], dtype=torch.bfloat16, device=_device()), impl="triton")),
        torch.tensor([True], device=_device()),
    )


def test_edge_values_and_layouts(interpret):
    x = torch.tensor([0.0, -0.0, 10.0, -10.0, 1e4, -1e4, math.inf, -math.inf, math.nan, 1e-40], device=_device())
    y = gelu(x, impl="triton")
    ref = F.gelu(x.double())
    assert torch.equal(torch.isnan(y).cpu(), torch.isnan(ref).cpu()) and y[6] == math.inf
    finite = torch.isfinite(ref)
    torch.testing.assert_close(y.double()[finite], ref[finite], atol=2e-6, rtol=2e-6)
    base = _x(64 * 30, torch.float32).reshape(64, 30).to(_device())
    view = base.t()[:, ::2]
    torch.testing.assert_close(gelu(view, impl="triton"), F.gelu(view), atol=2e-6, rtol=2e-6)
    assert gelu(torch.empty(0, 3, device=_device()), impl="triton").shape == (0, 3)
    assert gelu(torch.tensor(1.0, device=_device()), impl="triton").dim() == 0


@pytest.mark.parametrize("approximate", APPROX)
def test_gradcheck_float64(interpret, approximate):
    x = _x(24, torch.float64).to(_device()).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: gelu(t, impl="triton", approximate=approximate), (x,), eps=1e-6, atol=1e-6
    )


def test_interpreter_env_is_read_per_call(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    from trainlab.errors import HardwareError

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gelu(torch.ones(3), impl="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(HardwareError, match="TRITON_INTERPRET=1"):
        gelu(torch.ones(3), impl="triton")


@pytest.mark.gpu
def test_compiled_kernels_match_cpp_on_gpu():
    x = _x(1 << 20, torch.float32).cuda()
    torch.testing.assert_close(gelu(x, impl="triton"), F.gelu(x), atol=2e-6, rtol=2e-6)


def test_compiled_path_never_becomes_the_interpreter(monkeypatch):
    """With TRITON_INTERPRET=1 in the environment `triton.jit` returns an interpreter wrapper, which
    would copy CUDA tensors through NumPy without a word; the compiled path builds a JITFunction."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from trainlab.ops.gelu import gelu_triton

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(gelu_triton, "_kernels", {})
    assert isinstance(gelu_triton._get_kernel(False).fn, JITFunction)
    assert isinstance(gelu_triton._get_kernel(True).fn, InterpretedFunction)


def test_autotune_configs_compiled_many_interpreted_one(monkeypatch):
    """On a GPU the launch is tuned over the small config set, per size, pass and form; under the
    interpreter over one config, which Triton never benchmarks (tests pay nothing for tuning)."""
    from trainlab.ops.gelu import gelu_triton

    monkeypatch.setattr(gelu_triton, "_kernels", {})
    compiled, interpreted = gelu_triton._get_kernel(False), gelu_triton._get_kernel(True)
    assert [(c.kwargs["BLOCK"], c.num_warps) for c in compiled.configs] == list(gelu_triton.GELU_CONFIGS)
    assert compiled.keys == ["n", "ORDER", "FORM"]
    assert len(interpreted.configs) == 1 and interpreted.configs[0].kwargs == {"BLOCK": gelu_triton._BLOCK_INTERPRETED}
    for block, warps in gelu_triton.GELU_CONFIGS:  # every config a power of two with >= 8 elements per thread
        assert block & (block - 1) == 0 and block // (32 * warps) >= 8


@pytest.mark.gpu
def test_cuda_tensors_run_compiled_even_with_triton_interpret_set(monkeypatch):
    from trainlab.ops.gelu import gelu_triton

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(gelu_triton, "_warned_interpret_on_cuda", False)
    x = _x(1 << 16, torch.float32).cuda()
    with pytest.warns(RuntimeWarning, match="run compiled on CUDA"):
        y = gelu(x, impl="triton")
    assert y.is_cuda
    torch.testing.assert_close(y, F.gelu(x), atol=2e-6, rtol=2e-6)
