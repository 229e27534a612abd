"""GELU's check cases (run by ops/check.py like every operator's) and its autograd-table hooks.

Per approximation: ~4K random values (x 3) plus the edge values (+-0, +-10, +-1e4, +-inf, NaN,
denormals), which also carries the handout's recipe as an extra check; a strided (non-contiguous,
non-dense) view; a 0-dim tensor; an empty tensor. GELU is element-wise: its tolerance is the
"elementwise" one with S = 1 for the output and max|grad_out| for the gradient (ops/ladder.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trainlab.ops.gelu import APPROXIMATIONS, gelu, gelu_math, load
from trainlab.ops.ladder import TOLERANCES, Case

DTYPES = ("float32", "float64", "bfloat16")  # checked by default
REGISTERED = ("cpp", "cuda")  # triton is an autograd.Function here, not a registered op
DOUBLE_BACKWARD = True  # every rung differentiates its backward (gelu_bwd2): gradgradcheck too
BENCH: list = []  # no LeNet-5 layer: `ops bench --op gelu` sweeps tensor sizes (bench.run_gelu_bench)


def edge_values(dtype: torch.dtype) -> torch.Tensor:
    """+-0, large |x|, +-inf, NaN, denormals (the smallest subnormal and one just below normal)."""
    fi = torch.finfo(dtype)
    tiny = fi.smallest_normal
    vals = [
        0.0,
        -0.0,
        10.0,
        -10.0,
        1e4,
        -1e4,
        math.inf,
        -math.inf,
        math.nan,
        tiny / 2,
        -tiny / 2,
        tiny * fi.eps,
        -tiny * fi.eps,
        1.0,
        -1.0,
        3.0,
        -3.0,
        5.0,
        -5.0,
    ]
    return torch.tensor(vals, dtype=torch.float64).to(dtype)


def _bound(inputs64: dict, dy64: torch.Tensor, grad):
    """Element-wise: S = 1 for the output, max|dy| for the gradient."""
    x = inputs64["x"]  # max|dy| as a tensor like x: it stays on the rung's device (no sync, no .item())
    return 1.0, {"x": dy64.abs().amax().expand(x.shape) if dy64.numel() else 1.0}


def _with_edges(t: dict) -> dict:
    x = t["x"]  # already in the row's dtype and on its device: the edge values of that dtype
    return {**t, "x": torch.cat([x, edge_values(x.dtype).to(x.device)])}


def _strided(t: dict) -> dict:
    return {**t, "x": t["x"].t()[:, ::2]}  # neither contiguous nor dense


def handout_recipe(approximate: str):
    """The handout's test as a case's extra check: the same MSE loss through F.gelu (the aten rung:
    for the sigmoid form, torch's x * sigmoid(1.702 x)) and through the rung (same dtype, same
    inputs); the losses and the input gradients agree up to rounding. Also records `vs_exact`, the
    rung's max |y - x Phi(x)| on a grid over [-8, 8]: its kernel error for "none", the approximation's
    error otherwise (report 000's sigmoid form: ~0.020; tanh: 4.7e-4)."""

    def check(impl: str, dtype: torch.dtype, device: torch.device) -> dict:
        grid = torch.linspace(-8, 8, 4001, dtype=torch.float64).to(dtype)
        with torch.no_grad():
            vs_exact = gelu_math.error_vs_exact(gelu(grid.to(device), impl=impl, approximate=approximate).cpu(), grid)
        gen = torch.Generator().manual_seed(2)
        x0 = torch.randn(100, dtype=torch.float32, generator=gen).to(dtype).to(device)
        target = torch.randn(100, dtype=torch.float32, generator=gen).to(dtype).to(device)
        x1, x2 = x0.clone().requires_grad_(), x0.clone().requires_grad_()
        loss1 = F.mse_loss(gelu_math.aten(x1, approximate).float(), target.float())
        loss2 = F.mse_loss(gelu(x2, impl=impl, approximate=approximate).float(), target.float())
        loss1.backward()
        loss2.backward()
        grad_mse = float(((x1.grad.double() - x2.grad.double()) ** 2).mean())
        tol = TOLERANCES["elementwise"][dtype]
        loss_diff = abs(float(loss1.detach()) - float(loss2.detach()))
        # "equal up to rounding": a few output ulps of the dtype, relative to the loss / gradient size.
        ok = (
            loss_diff <= 4 * tol.rtol * abs(float(loss1.detach())) + tol.atol
            and grad_mse <= (4 * tol.rtol) ** 2 * float((x1.grad.double() ** 2).mean()) + tol.atol**2
        )
        return {"recipe_loss_diff": loss_diff, "recipe_grad_mse": grad_mse, "vs_exact": vs_exact, "ok": ok}

    return check


def _case(approximate: str, suffix: str, make, view=None, edge=False, extra=None) -> Case:
    name = approximate + (f"-{suffix}" if suffix else "")
    return Case(
        "gelu",
        name,
        make,
        lambda t, impl: gelu(t["x"], impl=impl, approximate=approximate),
        False,
        view,
        edge,
        bound=_bound,
        tolerance="elementwise",
        sized_by="n",
        variant=approximate,
        extra=extra,
    )


def _cases(approximate: str) -> list[Case]:
    return [
        _case(
            approximate,
            "",
            lambda n, gen: {"x": torch.randn(n, dtype=torch.float64, generator=gen) * 3},
            view=_with_edges,
            edge=True,
            extra=handout_recipe(approximate),
        ),
        _case(
            approximate,
            "strided",
            lambda n, gen: {"x": torch.randn(16, 12, dtype=torch.float64, generator=gen) * 3},
            view=_strided,
        ),
        _case(approximate, "0d", lambda n, gen: {"x": torch.tensor(-0.75, dtype=torch.float64)}),
        _case(approximate, "empty", lambda n, gen: {"x": torch.empty(0, 3, dtype=torch.float64)}),
    ]


CASES = [case for approximate in APPROXIMATIONS for case in _cases(approximate)]


def gradcheck_case(g: torch.Generator):
    """float64 inputs for gradcheck (and gradgradcheck), and fn(x, impl): every approximation, side by side."""
    x = torch.randn(24, dtype=torch.float64, generator=g) * 3
    return (x,), lambda x, impl: torch.cat([gelu(x, impl=impl, approximate=a) for a in APPROXIMATIONS])


def opcheck(impl: str, device: torch.device) -> bool:
    """torch.library.opcheck of the three registered ops (forward, backward, double backward)."""
    load()
    ok = True
    for dtype in (torch.float32, torch.float64):
        for a in APPROXIMATIONS:
            x = torch.randn(3, 5, dtype=dtype, device=device, requires_grad=True)
            g = torch.randn(3, 5, dtype=dtype, device=device)
            results = (
                torch.library.opcheck(torch.ops.trainlab.gelu_fwd.default, (x, a)),
                torch.library.opcheck(torch.ops.trainlab.gelu_bwd.default, (g.requires_grad_(), x, a)),
                torch.library.opcheck(
                    torch.ops.trainlab.gelu_bwd2.default, (torch.randn_like(g).requires_grad_(), g, x, a)
                ),
            )
            ok = ok and all(v == "SUCCESS" for r in results for v in r.values())
    return ok
