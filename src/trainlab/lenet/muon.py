"""`--optimizer muon`: Muon for the hidden layers' weight matrices, AdamW for everything else.

Muon (Jordan et al. 2024; `torch.optim.Muon`) takes SGD's Nesterov momentum and replaces the update by its
nearest semi-orthogonal matrix (five Newton–Schulz iterations): every direction of a layer's
weight moves by about the same amount, so the rare directions a small batch hardly sees still learn.
`torch.optim.Muon` takes 2-D parameters only; a convolution's filters are the matrix out × (in·k·k)
here (as in Jordan's CIFAR-10 runs), so conv1 and conv2 are Muon's too. The classifier (the last weight
matrix), the biases and BatchNorm's scales and shifts stay with AdamW, as Muon's authors advise.

One lr drives both: Muon's step is scaled by 0.2·√max(rows, cols) (torch's `adjust_lr_fn=
"match_rms_adamw"`), which gives its update the RMS of a typical AdamW update, so the schedule, the
peak lr and the decoupled weight decay mean the same for both groups. One optimizer holds one state
(torch's keys), so the LR schedules, checkpoints and the GradScaler take it unchanged; the AdamW half is
torch's fused AdamW kernel, the Muon half is written out. tests/test_lenet_muon.py holds the halves to
`torch.optim.Muon` (on the flattened filters) and `torch.optim.AdamW` step by step.

The step is capturable in a CUDA graph (lenet.step), so the `fast` preset's whole step is one replay:
it reads nothing from the host that changes per step. The lr is a device tensor where the step is
captured (lenet.setup.build_optimizer; the schedulers fill it in place), the AdamW step counts are device
tensors (torch's fused layout), and the momentum buffers are updated in place. On a GPU the step is
launch-bound (~2-5 µs a kernel, even in a graph), so the four matrices go through ONE batched
Newton–Schulz iteration (`orthogonalize`), and the elementwise work through foreach kernels.
"""

from __future__ import annotations

import math

import torch
from torch.optim.adamw import adamw

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's defaults (Jordan's quintic)
NS_STEPS = 5


def orthogonalize(
    mats: list[torch.Tensor], batched: bool, dtype: torch.dtype = torch.float32, eps: float = 1e-7
) -> list[torch.Tensor]:
    """≈ U·Vᵀ of each m = U·S·Vᵀ (singular values pushed into ~[0.7, 1.2]) by Newton–Schulz in `dtype`.

    `batched`: all matrices in one iteration, each zero-padded to the largest (wide) shape. That is exact:
    the iteration is an odd polynomial X·p(XᵀX), under which zero rows and columns stay zero, and each
    matrix is normalised by its own norm. It costs 3 kernels an iteration instead of 3 per matrix (what
    a GPU pays for), but multiplies the flops by the padding (fc1's 120×400 for every matrix: what a CPU
    pays for), so the caller decides by device. fp32, not torch's bf16: a CPU without bf16 matmul units
    runs LeNet's 120×400 iteration 19× slower in bf16 (1 thread); on a GPU these are launch-bound either way."""
    a, b, c = NS_COEFFICIENTS
    wide = [m if m.size(0) <= m.size(1) else m.mT for m in mats]
    out = []
    for chunk in [wide] if batched else [[m] for m in wide]:
        x = chunk[0].new_zeros(len(chunk), max(m.size(0) for m in chunk), max(m.size(1) for m in chunk), dtype=dtype)
        for i, m in enumerate(chunk):
            x[i, : m.size(0), : m.size(1)] = m
        x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)  # spectral ≤ Frobenius ≤ 1: the basin
        for _ in range(NS_STEPS):
            gram = x @ x.mT
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        out += [x[i, : m.size(0), : m.size(1)] for i, m in enumerate(chunk)]
    return [o if m.size(0) <= m.size(1) else o.mT for o, m in zip(out, mats, strict=True)]


def batched_on(device: torch.device) -> bool:
    """One Newton–Schulz for all matrices where kernels are launch-bound (a GPU), one per matrix where flops
    count (a CPU: benchmarks/results/lenet_cpu_step_muon.md); see `orthogonalize`."""
    return device.type != "cpu"


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the parameter groups marked `muon=True`, AdamW (torch's fused kernel) on the others."""

    def __init__(
        self,
        groups,
        lr: float | torch.Tensor,
        weight_decay: float,
        momentum: float = 0.95,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        ns_dtype: torch.dtype = torch.float32,
    ):
        # fused + capturable: torch keeps the AdamW step counts on the parameters' device (load_state_dict too)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fused=True, capturable=True)
        super().__init__(groups, dict(defaults, muon=False, muon_momentum=momentum))
        self.ns_dtype = ns_dtype  # bf16: torch.optim.Muon's numbers exactly (tests/test_lenet_muon.py)

    @torch.no_grad()
    def step(self, closure=None):
        with torch.enable_grad():
            loss = None if closure is None else closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                (self._muon if group["muon"] else self._adamw)(group, params)
        return loss

    def _adamw(self, group, params) -> None:
        states = [self.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if not state:  # torch.optim.AdamW(fused=True)'s state
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
        beta1, beta2 = group["betas"]
        adamw(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            fused=True,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
        )

    def _muon(self, group, params) -> None:
        lr, mu = group["lr"], group["muon_momentum"]  # lr: a float, or (captured) the scheduler's device tensor
        grads = [p.grad.reshape(p.size(0), -1) for p in params]  # filters out × (in·k·k): Muon's matrix
        for p, g in zip(params, grads, strict=True):
            if not self.state[p]:  # the key torch.optim.Muon uses
                self.state[p]["momentum_buffer"] = torch.zeros_like(g)
        bufs = [self.state[p]["momentum_buffer"] for p in params]
        torch._foreach_lerp_(bufs, grads, 1 - mu)
        nesterov = torch._foreach_lerp(grads, bufs, mu)  # one momentum step ahead
        updates = orthogonalize(nesterov, batched=batched_on(params[0].device), dtype=self.ns_dtype)
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])  # decoupled decay
        for p, u in zip(params, updates, strict=True):
            scale = -0.2 * math.sqrt(max(u.shape))
            u = u.to(p.dtype).reshape(p.shape)  # a view of the padded batch, in fp32 (as torch's add_ computes)
            if torch.is_tensor(lr):  # the same product, read from the device at every replay
                p.addcmul_(u, lr, value=scale)
            else:  # in double on the host, as torch.optim.Muon does
                p.add_(u, alpha=lr * scale)


def muon_groups(model: torch.nn.Module) -> list[dict]:
    """The hidden layers' weights (≥ 2-D, all but the last such: the classifier) for Muon; the rest for AdamW."""
    params = list(model.parameters())
    matrices = [i for i, p in enumerate(params) if p.ndim >= 2]
    hidden = set(matrices[:-1])
    return [
        {"params": [p for i, p in enumerate(params) if i in hidden], "muon": True},
        {"params": [p for i, p in enumerate(params) if i not in hidden], "muon": False},
    ]
