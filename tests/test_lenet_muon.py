"""`--optimizer muon` (lenet/muon.py) against torch.optim.Muon and torch.optim.AdamW, step by step.

The references are torch's own implementations: the hidden weights must follow `torch.optim.Muon`
(adjust_lr_fn="match_rms_adamw") run on 2-D copies of them (a convolution's filters flattened to
out × in·k·k), the rest `torch.optim.AdamW`, after every step of a schedule that changes the lr, and
through a state_dict round trip.
"""

from __future__ import annotations

import copy

import torch

from trainlab.lenet.config import TrainConfig
from trainlab.lenet.model import LeNet5
from trainlab.lenet.muon import MuonAdamW, muon_groups
from trainlab.lenet.plan import resolve
from trainlab.lenet.setup import build_optimizer

LR, WD = 2e-2, 1e-2


class Flat(torch.nn.Module):
    """The reference: LeNet-5's hidden weights held as 2-D parameters (what torch.optim.Muon takes)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.shapes = {n: p.shape for n, p in model.named_parameters()}
        self.flat = torch.nn.ParameterDict(
            {
                n.replace(".", "_"): torch.nn.Parameter(p.detach().reshape(p.size(0), -1).clone())
                for n, p in self._hidden()
            }
        )

    def _hidden(self):
        named = list(self.model.named_parameters())
        matrices = [n for n, p in named if p.ndim >= 2][:-1]
        return [(n, p) for n, p in named if n in matrices]

    def forward(self, x):
        weights = {n: self.flat[n.replace(".", "_")].view(self.shapes[n]) for n, _ in self._hidden()}
        rest = {n: p for n, p in self.model.named_parameters() if n not in weights}
        return torch.func.functional_call(self.model, {**rest, **weights}, (x,))


def _batches(steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)


def _step(model, opts, sched, x, y):
    for o in opts:
        o.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for o in opts:
        o.step()
    for s in sched:
        s.step()


def _reference(model):
    ref = Flat(model)
    muon = torch.optim.Muon(ref.flat.parameters(), lr=LR, weight_decay=WD, adjust_lr_fn="match_rms_adamw")
    hidden = {id(p) for _, p in ref._hidden()}
    rest = [p for p in model.parameters() if id(p) not in hidden]
    adamw = torch.optim.AdamW(rest, lr=LR, weight_decay=WD, foreach=False)
    return ref, [muon, adamw]


def _same(ref, mine, step):
    hidden = dict(ref._hidden())
    for name, q in mine.named_parameters():
        want = ref.flat[name.replace(".", "_")].view(q.shape) if name in hidden else ref.model.get_parameter(name)
        # bf16 Newton–Schulz: both sides round the same way, but let a last bit differ
        torch.testing.assert_close(q, want, rtol=1e-5, atol=1e-6, msg=f"step {step}: {name} differs")


def test_muon_half_follows_torch_muon_and_the_rest_torch_adamw_under_a_schedule_and_a_resume():
    torch.manual_seed(0)
    a = LeNet5()
    b = copy.deepcopy(a)
    ref, opts = _reference(a)
    mine = MuonAdamW(muon_groups(b), lr=LR, weight_decay=WD, ns_dtype=torch.bfloat16)  # torch's Newton–Schulz dtype
    assert [len(g["params"]) for g in mine.param_groups] == [4, 6]  # conv1, conv2, fc1, fc2 | biases, fc3
    decay = lambda s: 1.0 - s / 20  # noqa: E731
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, decay) for o in opts]
    mine_sched = torch.optim.lr_scheduler.LambdaLR(mine, decay)
    start = [p.detach().clone() for p in b.parameters()]
    for step, (x, y) in enumerate(_batches(8)):
        _step(ref, opts, scheds, x, y)
        _step(b, [mine], [mine_sched], x, y)
        _same(ref, b, step)
    assert all(not torch.equal(p, s) for p, s in zip(b.parameters(), start, strict=True))  # every one moved

    c = copy.deepcopy(b)
    resumed = MuonAdamW(muon_groups(c), lr=LR, weight_decay=WD, ns_dtype=torch.bfloat16)
    resumed.load_state_dict(mine.state_dict())
    for x, y in _batches(3, seed=2):
        _step(ref, opts, [], x, y)
        _step(c, [resumed], [], x, y)
    _same(ref, c, "after resume")


def test_the_plan_builds_muon_unfused_and_outside_the_cuda_graph():
    cfg = TrainConfig(optimizer="muon", schedule="linear", device="cpu")
    plan = resolve(cfg, torch.device("cpu"))
    assert not plan.fused_optimizer and not plan.capturable
    opt = build_optimizer(plan, LeNet5())
    assert type(opt) is MuonAdamW and all(g["lr"] == plan.lr for g in opt.param_groups)
    # on CUDA the graph holds forward + backward and Muon steps after each replay (resolve reads the type only)
    cuda = resolve(cfg, torch.device("cuda"))
    assert cuda.step_mode == "cudagraph" and not cuda.capturable and not cuda.optimizer_in_graph


def test_fp32_newton_schulz_is_torchs_bf16_one_without_its_rounding():
    """The default (fp32) orthogonalization: the same iteration as torch.optim.Muon's bf16 one, so the two agree
    to bf16's precision, and each update's singular values lie in the band the quintic aims at."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    from trainlab.lenet.muon import NS_COEFFICIENTS, NS_STEPS, orthogonalize

    g = torch.randn(120, 400, generator=torch.Generator().manual_seed(0)) * 1e-3
    mine = orthogonalize(g)
    assert mine.dtype == torch.float32
    ref = _zeropower_via_newtonschulz(g, NS_COEFFICIENTS, NS_STEPS, 1e-7).float()
    assert (mine - ref).norm() / ref.norm() < 0.03  # bf16 keeps 8 bits: ~0.4 % a product, five iterations
    s = torch.linalg.svdvals(mine.double())
    assert 0.6 < s.min() and s.max() < 1.25
    assert torch.allclose(orthogonalize(g.T), mine.T, atol=1e-5)  # tall matrices go through the transpose
