"""Double (and third) backward through every GELU implementation, against F.gelu and float64.

Before the `gelu_bwd2` kernels, grad-of-grad through impl='cpp'/'triton' silently treated the
backward as a constant (a UserWarning, wrong values): a gradient penalty, a Hessian-vector product or
a WGAN-GP term trained on wrong gradients. Now each impl registers its backward's own derivative.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

from trainlab.ops.gelu import gelu, gelu_math

APPROX = ["none", "tanh"]


@pytest.fixture(params=["python", "cpp", "triton"])
def impl(request, monkeypatch):
    if request.param == "cpp":
        request.getfixturevalue("gelu_ext")
    if request.param == "triton":
        pytest.importorskip("triton")
        if not torch.cuda.is_available():
            monkeypatch.setenv("TRITON_INTERPRET", "1")
    return request.param


def _device(impl):
    return "cuda" if impl == "triton" and torch.cuda.is_available() else "cpu"


def _x(n, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64).mul(3).to(dtype)


@pytest.mark.parametrize("approximate", APPROX)
def test_closed_form_derivatives_match_autograd_of_f_gelu(approximate):
    x = torch.linspace(-12, 12, 2001, dtype=torch.float64, requires_grad=True)
    (d1,) = torch.autograd.grad(F.gelu(x, approximate=approximate).sum(), x, create_graph=True)
    (d2,) = torch.autograd.grad(d1.sum(), x, create_graph=True)
    (d3,) = torch.autograd.grad(d2.sum(), x)
    xs = x.detach()
    torch.testing.assert_close(gelu_math.derivative(xs, approximate), d1.detach(), atol=1e-14, rtol=1e-12)
    torch.testing.assert_close(gelu_math.second_derivative(xs, approximate), d2.detach(), atol=1e-13, rtol=1e-11)
    torch.testing.assert_close(gelu_math.third_derivative(xs, approximate), d3, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("approximate", APPROX)
def test_gradgradcheck_float64(impl, approximate):
    x = _x(24).to(_device(impl)).requires_grad_()
    fast = impl == "triton" and not torch.cuda.is_available()  # the interpreter is slow; still catches a wrong Jacobian
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the old fallback warned "autograd kernel was not registered"
        assert torch.autograd.gradgradcheck(lambda t: gelu(t, impl=impl, approximate=approximate), (x,), fast_mode=fast)


@pytest.mark.parametrize("approximate", APPROX)
def test_third_order_is_exact_too(impl, approximate):
    x = _x(12, seed=1).to(_device(impl)).requires_grad_()

    def first_grad(t):
        return torch.autograd.grad(gelu(t, impl=impl, approximate=approximate).sum(), t, create_graph=True)[0]

    assert torch.autograd.gradgradcheck(first_grad, (x,), fast_mode=impl == "triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", APPROX)
def test_double_backward_low_precision_vs_float64(impl, dtype, approximate):
    """gg·g·GELU''(x) in float32 math, rounded once: at least as close to float64 as F.gelu's own
    double backward (which, for tanh in float32, loses digits in 1 - tanh²)."""
    x = _x(20000, dtype, seed=2).to(_device(impl))
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(3)).to(dtype).to(x.device)
    gg = torch.randn(x.shape, generator=torch.Generator().manual_seed(4)).to(dtype).to(x.device)
    ref = gelu_math.bwd2(gg.double(), g.double(), x.double(), approximate)

    def second(fn):
        xr = x.clone().requires_grad_()
        (d,) = torch.autograd.grad(fn(xr), xr, g, create_graph=True)
        return torch.autograd.grad(d, xr, gg)[0].double()

    ours = (second(lambda t: gelu(t, impl=impl, approximate=approximate)) - ref).abs().max()
    aten = (second(lambda t: F.gelu(t, approximate=approximate)) - ref).abs().max()
    scale = float((gg.double() * g.double()).abs().max())
    bound = {torch.float32: 4e-6, torch.bfloat16: 2.0**-7 * 2}[dtype] * scale
    assert ours <= max(bound, 1.01 * aten), (float(ours), float(aten))


def test_gradient_penalty_matches_f_gelu(impl):
    """A WGAN-GP style penalty through a small critic: the gradient that reaches the weights goes
    through GELU's second derivative. Same numbers as with F.gelu."""
    device = _device(impl)
    torch.manual_seed(0)
    w1 = torch.randn(5, 3, dtype=torch.float64, device=device, requires_grad=True)
    w2 = torch.randn(1, 5, dtype=torch.float64, device=device, requires_grad=True)
    x = torch.tensor([[-1.0, 0.5, 2.0], [0.3, -0.7, 1.1]], dtype=torch.float64, device=device, requires_grad=True)

    def penalty_grads(act):
        score = (act(x @ w1.t()) @ w2.t()).sum()
        (gx,) = torch.autograd.grad(score, x, create_graph=True)
        penalty = ((gx.norm(dim=1) - 1) ** 2).mean()
        return torch.autograd.grad(penalty, (w1, w2, x))

    ref = penalty_grads(F.gelu)
    ours = penalty_grads(lambda t: gelu(t, impl=impl))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    assert ref[0].abs().sum() > 0.1  # the second-derivative path carries real gradient


def test_opcheck_double_backward_op(gelu_ext):
    for approximate in APPROX:
        args = (
            torch.randn(4, 5, requires_grad=True),
            torch.randn(4, 5, requires_grad=True),
            torch.randn(4, 5, requires_grad=True),
            approximate,
        )
        torch.library.opcheck(torch.ops.trainlab.gelu_bwd2.default, args)
    with pytest.raises(RuntimeError, match="grad_grad shape"):
        torch.ops.trainlab.gelu_bwd2(torch.zeros(3), torch.zeros(4), torch.zeros(4), "none")
