r"""GELU and its first three derivatives as plain torch expressions: the one statement of the math.

Every kernel (C++, CUDA, Triton) computes the same formulas, and these torch versions serve three
jobs: the `python` implementation's forward and backward, the closed-form reference the kernels'
double backward is tested against, and the *third* order of the compiled ops (the backward of the
double-backward op), which is rare enough that the extra unfused passes do not matter and which,
being torch ops, stays differentiable to any order.

With Phi the standard normal CDF and phi its density, phi' = -x phi:

    exact:  y   = x Phi(x)
            d   = dy/dx   = Phi + x phi
            d'  = d2y/dx2 = 2 phi - x^2 phi         = phi (2 - x^2)
            d'' = d3y/dx3 = -x phi (2 - x^2) - 2x phi = x phi (x^2 - 4)

    tanh:   u = beta (x + kappa x^3),  u' = beta (1 + 3 kappa x^2),  u'' = 6 beta kappa x,
            u''' = 6 beta kappa,  t = tanh(u),  t' = (1 - t^2) u'
            y   = x/2 (1 + t)
            d   = (1 + t)/2 + x/2 (1 - t^2) u'
            d'  = (1 - t^2) A,          A  = u' + x/2 (u'' - 2 t u'^2)
            d'' = (1 - t^2) (A' - 2 t u' A),
                                        A' = 3/2 u'' - t u'^2 + x/2 (u''' - 2 (1 - t^2) u'^3 - 4 t u' u'')

    sigmoid (report 000): z = k x, k = 1.702, s = sigmoid(z), A = s (1 - s), s' = k A,
            A' = k A (1 - 2s),  (1 - 2s)^2 = 1 - 4A
            y   = x s
            d   = s + z A
            d'  = k A (2 + z (1 - 2s))
            d'' = k^2 A (3 (1 - 2s) + z (1 - 6A))

(product and chain rule on the line above each; ATen's `gelu_double_backward` spells d' the same
way, term by term). 1 - t^2 is evaluated as sech^2 u = 4e / (1 + e)^2 with e = exp(-2|u|): `1 - t*t`
loses every digit once |u| > ~8 in float32 (t rounds to 1), and the second derivative multiplies
that loss by x u'^2, which made float32 errors 30x those of ATen before this form was used. The backward of GELU needs only x; the double backward of `bwd(g, x) = g d(x)`
is `d(gg) = gg d(x)` for g and `gg g d'(x)` for x, which is what the `gelu_bwd2` kernels compute.
The sigmoid form's A = s (1 - s) is evaluated as e / (1 + e)^2 with e = exp(-|z|) for the same
reason as sech^2 (1 - s is 0 in float32 once z > ~17).

The sigmoid form is an approximation of the exact GELU, not of its own float64 value: its maximum
error against x Phi(x) is 0.0203 (at x = -2.27) where the tanh form's is 4.7e-4 (at x = 2.70) (`error_vs_exact`
measures it on the check's inputs, and the check table reports it for every row).

bfloat16/float16 inputs are evaluated in float32 and rounded once, as ATen does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainlab.ops.ladder import widen

SQRT1_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
BETA = math.sqrt(2.0 / math.pi)
KAPPA = 0.044715
SIGMOID_K = 1.702


def sech2(u: torch.Tensor) -> torch.Tensor:
    """1 - tanh(u)^2 without cancellation: 4e / (1 + e)^2, e = exp(-2|u|)."""
    e = torch.exp(-2.0 * u.abs())
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


def sig_var(z: torch.Tensor) -> torch.Tensor:
    """s (1 - s), s = sigmoid(z), without cancellation: e / (1 + e)^2, e = exp(-|z|)."""
    e = torch.exp(-z.abs())
    return e / ((1.0 + e) * (1.0 + e))


def aten(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """The `aten` rung: F.gelu, and for the sigmoid form (which F.gelu lacks) the torch ops
    x * sigmoid(1.702 x), bfloat16/float16 widened to float32 and rounded once, as F.gelu does."""
    if approximate == "sigmoid":
        xw = widen(x)
        return (xw * torch.sigmoid(SIGMOID_K * xw)).to(x.dtype)
    return F.gelu(x, approximate=approximate)


def reference(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """The check's reference: `aten` on float64 inputs (differentiable, torch's own autograd)."""
    return aten(x.double(), approximate)


def error_vs_exact(y: torch.Tensor, x: torch.Tensor) -> float:
    """max |y - x Phi(x)| over the finite entries of the float64 exact GELU: how far a rung's output
    is from the *exact* form (its kernel error for "none", the approximation's error otherwise)."""
    exact = F.gelu(x.detach().double())
    finite = torch.isfinite(exact) & torch.isfinite(y.detach().double().to(exact.device))
    if not finite.any():
        return 0.0
    return float((y.detach().double().to(exact.device)[finite] - exact[finite]).abs().max())


def forward(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """y = GELU(x), computed in x's dtype (callers widen 16-bit inputs)."""
    if approximate == "sigmoid":
        return x / (1.0 + torch.exp(-SIGMOID_K * x))
    if approximate == "tanh":
        u = BETA * (x + KAPPA * x * x * x)
        return 0.5 * x * (1.0 + torch.tanh(u))
    return 0.5 * x * (1.0 + torch.erf(x * SQRT1_2))


def derivative(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """d = dy/dx."""
    if approximate == "sigmoid":
        z = SIGMOID_K * x
        return torch.sigmoid(z) + z * sig_var(z)
    if approximate == "tanh":
        x2 = x * x
        t = torch.tanh(BETA * (x + KAPPA * x2 * x))
        du = BETA * (1.0 + 3.0 * KAPPA * x2)
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
    cdf = 0.5 * (1.0 + torch.erf(x * SQRT1_2))
    pdf = INV_SQRT_2PI * torch.exp(-0.5 * x * x)
    return cdf + x * pdf


def second_derivative(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """d' = d2y/dx2."""
    if approximate == "sigmoid":
        z = SIGMOID_K * x
        return SIGMOID_K * sig_var(z) * (2.0 + z * (1.0 - 2.0 * torch.sigmoid(z)))
    x2 = x * x
    if approximate == "tanh":
        u = BETA * (x + KAPPA * x2 * x)
        t = torch.tanh(u)
        du = BETA * (1.0 + 3.0 * KAPPA * x2)
        d2u = 6.0 * BETA * KAPPA * x
        return sech2(u) * (du + 0.5 * x * (d2u - 2.0 * t * du * du))
    return INV_SQRT_2PI * torch.exp(-0.5 * x2) * (2.0 - x2)


def third_derivative(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """d'' = d3y/dx3."""
    if approximate == "sigmoid":
        z = SIGMOID_K * x
        a = sig_var(z)
        return SIGMOID_K**2 * a * (3.0 * (1.0 - 2.0 * torch.sigmoid(z)) + z * (1.0 - 6.0 * a))
    x2 = x * x
    if approximate == "tanh":
        u = BETA * (x + KAPPA * x2 * x)
        t = torch.tanh(u)
        s2 = sech2(u)
        du = BETA * (1.0 + 3.0 * KAPPA * x2)
        d2u = 6.0 * BETA * KAPPA * x
        d3u = 6.0 * BETA * KAPPA
        a = du + 0.5 * x * (d2u - 2.0 * t * du * du)
        da = 1.5 * d2u - t * du * du + 0.5 * x * (d3u - 2.0 * s2 * du * du * du - 4.0 * t * du * d2u)
        return s2 * (da - 2.0 * t * du * a)
    return INV_SQRT_2PI * torch.exp(-0.5 * x2) * x * (x2 - 4.0)


def bwd2(gg: torch.Tensor, g: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
    """gg * g * d'(x): the x-gradient of `g * d(x)` (what the gelu_bwd2 kernels compute)."""
    out = widen(gg) * widen(g) * second_derivative(widen(x), approximate)
    return out.to(x.dtype)


def bwd2_backward(ggg: torch.Tensor, gg: torch.Tensor, g: torch.Tensor, x: torch.Tensor, approximate: str):
    """Gradients of `gg * g * d'(x)` w.r.t. (gg, g, x) for an incoming gradient ggg: the third order.

    Plain torch ops, so autograd can differentiate them again (fourth order and beyond)."""
    dtype = x.dtype
    ggg, gg, g, x = (widen(t) for t in (ggg, gg, g, x))
    s = second_derivative(x, approximate)
    return (
        (ggg * g * s).to(dtype),
        (ggg * gg * s).to(dtype),
        (ggg * gg * g * third_derivative(x, approximate)).to(dtype),
    )
