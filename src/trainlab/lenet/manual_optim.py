"""Hand-written optimizers (`--optimizer manual-sgd | manual-adamw`): the parameter update written out.

The course notes' `sgd(params, lr)` and report 002 write the update as a loop over the parameter list
with plain tensor ops under `torch.no_grad()`; these two classes are that loop, with the same
semantics as the torch.optim classes trainlab uses otherwise, so a run can swap one for the other and
get the same weights (tests/test_lenet_manual_optim.py compares them step by step):

- `ManualSGD` = `torch.optim.SGD(momentum=μ, nesterov=True, weight_decay=λ)`:
  g ← g + λ·p;  b ← g at the first step, else μ·b + g;  p ← p − lr·(g + μ·b)   (Nesterov)
- `ManualAdamW` = `torch.optim.AdamW(betas=(β1, β2), eps=ε, weight_decay=λ)` (decoupled decay):
  p ← p·(1 − lr·λ);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  t ← t + 1;
  p ← p − lr/(1−β1ᵗ) · m / (√v / √(1−β2ᵗ) + ε)

They subclass `torch.optim.Optimizer` only for its bookkeeping (param groups, `state_dict`, `zero_grad`),
so the LR schedules (OneCycle cycles AdamW's β1 and SGD's momentum through `param_groups`), checkpoints,
the fp16 GradScaler and the data-parallel modes take them unchanged. The update itself calls no torch.optim
code: it is one Python loop, ~4 (SGD) or ~9 (AdamW) tensor ops per parameter, which is what torch's
`foreach=False` path does and what its fused kernel does in one pass (plan.fused_optimizer: off here).
"""

from __future__ import annotations

import math

import torch

MANUAL_OPTIMIZERS = ("manual-sgd", "manual-adamw")


class ManualSGD(torch.optim.Optimizer):
    """SGD with Nesterov momentum and L2 weight decay, written out (see the module docstring)."""

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    def step(self, closure=None):
        loss = None if closure is None else closure()  # in the caller's grad mode, as torch.optim does
        with torch.no_grad():
            self._update()
        return loss

    def _update(self) -> None:
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad if wd == 0 else p.grad.add(p, alpha=wd)  # L2: the decay goes through the momentum
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:  # torch starts the buffer at the first gradient, not at zero
                    buf = state["momentum_buffer"] = g.clone()
                else:
                    buf.mul_(mu).add_(g)
                p.sub_(g.add(buf, alpha=mu), alpha=lr)  # Nesterov: look one momentum step ahead


class ManualAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, bias-corrected moments), written out (see the module docstring)."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def step(self, closure=None):
        loss = None if closure is None else closure()
        with torch.no_grad():
            self._update()
        return loss

    def _update(self) -> None:
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:  # the same keys as torch.optim.AdamW's state
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                t = int(state["step"].item())  # a host tensor (torch's non-capturable layout): no device sync
                p.mul_(1 - lr * wd)  # decoupled decay: shrinks the weight, never enters the moments
                m.lerp_(g, 1 - beta1)  # m ← β1·m + (1−β1)·g
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1 - beta1**t))


def build_manual(name: str, params, lr: float, weight_decay: float, momentum: float) -> torch.optim.Optimizer:
    """`--optimizer manual-sgd | manual-adamw` with the same hyperparameters as its torch.optim twin."""
    if name == "manual-sgd":
        return ManualSGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return ManualAdamW(params, lr=lr, weight_decay=weight_decay)
