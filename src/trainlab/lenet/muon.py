"""`--optimizer muon`: Muon for the hidden layers' weight matrices, AdamW for everything else.

Muon (Jordan et al. 2024; `torch.optim.Muon`) takes SGD's Nesterov momentum and replaces the update by its
nearest semi-orthogonal matrix (five Newton–Schulz iterations): every direction of a layer's
weight moves by about the same amount, so the rare directions a small batch hardly sees still learn.
`torch.optim.Muon` takes 2-D parameters only; a convolution's filters are the matrix out × (in·k·k)
here (as in Jordan's CIFAR-10 runs), so conv1 and conv2 are Muon's too. The classifier (the last weight
matrix), the biases and BatchNorm's scales and shifts stay with AdamW, as Muon's authors advise.

One lr drives both: Muon's step is scaled by 0.2·√max(rows, cols) (torch's `adjust_lr_fn=
"match_rms_adamw"`), which gives its update the RMS of a typical AdamW update, so the schedule, the
peak lr and the decoupled weight decay mean the same for both groups. The update is written out (the
AdamW half is `ManualAdamW`'s), so one optimizer holds one state and takes the LR schedules, checkpoints
and the GradScaler unchanged; tests/test_lenet_muon.py holds the Muon half to `torch.optim.Muon` step by
step (on the flattened filters).
"""

from __future__ import annotations

import math

import torch

from trainlab.lenet.manual_optim import ManualAdamW

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's defaults (Jordan's quintic)
NS_STEPS = 5


def orthogonalize(g: torch.Tensor, dtype: torch.dtype = torch.float32, eps: float = 1e-7) -> torch.Tensor:
    """≈ U·Vᵀ of g = U·S·Vᵀ (singular values pushed into ~[0.7, 1.2]) by Newton–Schulz in `dtype`.
    fp32, not torch's bf16: a CPU without bf16 matmul units runs LeNet's 120×400 iteration 19× slower in
    bf16 (1 thread), and on a GPU these small matrices are launch-bound either way."""
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    wide = x.size(0) <= x.size(1)
    x = x if wide else x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm ≤ Frobenius norm ≤ 1: inside the iteration's basin
    for _ in range(NS_STEPS):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x if wide else x.T


class MuonAdamW(ManualAdamW):
    """Muon on the parameter groups marked `muon=True`, AdamW (`ManualAdamW`) on the others."""

    def __init__(
        self, groups, lr: float, weight_decay: float, momentum: float = 0.95, ns_dtype: torch.dtype = torch.float32
    ):
        super().__init__(groups, lr=lr, weight_decay=weight_decay)
        self.ns_dtype = ns_dtype  # bf16: torch.optim.Muon's numbers exactly (tests/test_lenet_muon.py)
        for group in self.param_groups:
            group.setdefault("muon", False)
            group.setdefault("muon_momentum", momentum)

    def _update(self) -> None:
        adamw = [g for g in self.param_groups if not g["muon"]]
        self._adamw_update(adamw)
        for group in self.param_groups:
            if group["muon"]:
                self._muon_update(group)

    def _muon_update(self, group) -> None:
        lr, wd, mu = group["lr"], group["weight_decay"], group["muon_momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            g = p.grad.reshape(p.size(0), -1)  # filters out × (in·k·k): Muon's matrix
            state = self.state[p]
            if not state:  # the key torch.optim.Muon uses
                state["momentum_buffer"] = torch.zeros_like(g)
            buf = state["momentum_buffer"]
            buf.lerp_(g, 1 - mu)
            update = orthogonalize(g.lerp(buf, mu), self.ns_dtype).to(p.dtype)  # Nesterov: one momentum step ahead
            rows, cols = g.shape
            p.mul_(1 - lr * wd)
            p.add_(update.view_as(p), alpha=-lr * 0.2 * math.sqrt(max(rows, cols)))


def muon_groups(model: torch.nn.Module) -> list[dict]:
    """The hidden layers' weights (≥ 2-D, all but the last such: the classifier) for Muon; the rest for AdamW."""
    params = list(model.parameters())
    matrices = [i for i, p in enumerate(params) if p.ndim >= 2]
    hidden = set(matrices[:-1])
    return [
        {"params": [p for i, p in enumerate(params) if i in hidden], "muon": True},
        {"params": [p for i, p in enumerate(params) if i not in hidden], "muon": False},
    ]
