"""`--optimizer muon` (lenet/muon.py) against torch.optim.Muon and torch.optim.AdamW, step by step.

The references are torch's own implementations: the hidden weights must follow `torch.optim.Muon`
(adjust_lr_fn="match_rms_adamw") run on 2-D copies of them (a convolution's filters flattened to
out × in·k·k), the rest `torch.optim.AdamW` (its fused kernel, which ours calls), after every step of a
schedule that changes the lr, and through a state_dict round trip. The capturable form (what a CUDA
graph replays: the lr a device tensor the scheduler fills) must follow that eager form, and the batched
Newton–Schulz a GPU runs the per-matrix one a CPU runs. The graph itself: tests/test_lenet_step.py (gpu).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from trainlab.lenet.config import TrainConfig
from trainlab.lenet.model import LeNet5
from trainlab.lenet.muon import NS_COEFFICIENTS, NS_STEPS, MuonAdamW, muon_groups, orthogonalize
from trainlab.lenet.plan import resolve
from trainlab.lenet.setup import build_model, build_optimizer, build_scheduler

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
    adamw = torch.optim.AdamW(rest, lr=LR, weight_decay=WD, fused=True)
    return ref, [muon, adamw]


def _same(ref, mine, step):
    hidden = dict(ref._hidden())
    for name, q in mine.named_parameters():
        want = ref.flat[name.replace(".", "_")].view(q.shape) if name in hidden else ref.model.get_parameter(name)
        # bf16 Newton–Schulz: both sides round the same way, but let a last bit differ
        torch.testing.assert_close(q, want, rtol=1e-5, atol=1e-6, msg=f"step {step}: {name} differs")


def _close(a, b, step):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=CAPTURABLE_TOL, atol=CAPTURABLE_TOL, msg=f"step {step}: {name} differs")


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


# The lr as a float32 device tensor rounds lr·λ and lr·scale otherwise than the host's doubles: ~1e-7 a
# step here; a frozen lr (the schedule below moves it by 5 % a step) or a stale momentum is off by ~1e-3.
CAPTURABLE_TOL = 2e-6


@pytest.mark.parametrize("batched", [False, True])
def test_the_capturable_form_follows_the_eager_one_under_the_fast_schedule_and_a_resume(batched, monkeypatch):
    """What a CUDA graph replays, built as a captured step builds it (plan.capturable: the lr a device
    tensor the LR scheduler fills in place, here on the CPU), against the float-lr form held to torch above,
    under the `fast` preset's warm-up and decay and through a state_dict round trip into a fresh one.
    `batched`: with the GPU's one Newton–Schulz over the zero-padded matrices (forced on the CPU)."""
    import trainlab.lenet.muon as muon

    def advance(model, opt, sched, x, y):  # the captured form batched or not, the eager one per matrix
        monkeypatch.setattr(muon, "batched_on", lambda device: batched and opt is not eager)
        _step(model, [opt], sched, x, y)

    cfg = TrainConfig(device="cpu", optimizer="muon", schedule="linear", warmup_epochs=0.5, amp="off", epochs=1)
    eager_plan = resolve(dataclasses.replace(cfg, channels_last="off", ops="aten"), torch.device("cpu"))
    captured_plan = dataclasses.replace(eager_plan, capturable=True)  # what resolve gives on CUDA
    models, opts, scheds = [], [], []
    for plan in (eager_plan, captured_plan):
        models.append(build_model(plan))
        opts.append(build_optimizer(plan, models[-1]))
        scheds.append(build_scheduler(plan, opts[-1], plan.lr, steps_per_epoch=12))
    eager, captured = opts
    lr = captured.param_groups[0]["lr"]
    assert torch.is_tensor(lr) and not torch.is_tensor(eager.param_groups[0]["lr"])
    for step, (x, y) in enumerate(_batches(8)):
        for model, opt, sched in zip(models, opts, scheds, strict=True):
            advance(model, opt, [sched], x, y)
        _close(*models, step)
        assert captured.param_groups[0]["lr"] is lr  # filled in place, as a graph needs
        assert float(lr) == pytest.approx(eager.param_groups[0]["lr"], rel=1e-7)
    assert all(torch.is_tensor(s["step"]) for s in captured.state.values() if "step" in s)  # AdamW's counts

    resumed_model = copy.deepcopy(models[1])
    resumed = build_optimizer(captured_plan, resumed_model)
    resumed.load_state_dict(captured.state_dict())
    for x, y in _batches(3, seed=2):
        advance(models[0], eager, [], x, y)
        advance(resumed_model, resumed, [], x, y)
    _close(models[0], resumed_model, "after resume")


def test_one_batched_newton_schulz_over_zero_padded_matrices_is_the_per_matrix_one():
    """What a GPU runs (all matrices zero-padded to one shape, one iteration) against what a CPU runs (one
    iteration per matrix): LeNet's four hidden shapes and a tall one, at norms 1 to 1e-4 (each must be
    normalised by its own), in fp32 and torch's bf16."""
    g = torch.Generator().manual_seed(0)
    shapes = [(6, 25), (16, 150), (120, 400), (84, 120), (40, 12)]
    mats = [torch.randn(s, generator=g) * 10.0**-i for i, s in enumerate(shapes)]
    for dtype in (torch.float32, torch.bfloat16):
        one = orthogonalize(mats, batched=True, dtype=dtype)
        each = orthogonalize(mats, batched=False, dtype=dtype)
        for m, a, b in zip(mats, one, each, strict=True):
            assert a.shape == b.shape == m.shape
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_plan_captures_muon_on_cuda_and_builds_it_capturable():
    cfg = TrainConfig(optimizer="muon", schedule="linear", device="cpu")
    plan = resolve(cfg, torch.device("cpu"))
    assert plan.fused_optimizer and not plan.capturable  # fused: its AdamW half
    opt = build_optimizer(plan, LeNet5())
    assert type(opt) is MuonAdamW and all(g["lr"] == plan.lr for g in opt.param_groups)
    # on CUDA the whole step is one graph (resolve reads the device's type only); not under OneCycle,
    # whose beta1 the fused AdamW half takes as a host float
    cuda = resolve(cfg, torch.device("cuda"))
    assert cuda.step_mode == "cudagraph" and cuda.capturable and cuda.optimizer_in_graph
    assert not resolve(dataclasses.replace(cfg, schedule="onecycle"), torch.device("cuda")).optimizer_in_graph


def test_fp32_newton_schulz_is_torchs_bf16_one_without_its_rounding():
    """The default (fp32) orthogonalization: the same iteration as torch.optim.Muon's bf16 one, so the two agree
    to bf16's precision, and each update's singular values lie in the band the quintic aims at."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    g = torch.randn(120, 400, generator=torch.Generator().manual_seed(0)) * 1e-3
    (mine,) = orthogonalize([g], batched=False)
    assert mine.dtype == torch.float32
    ref = _zeropower_via_newtonschulz(g, NS_COEFFICIENTS, NS_STEPS, 1e-7).float()
    assert (mine - ref).norm() / ref.norm() < 0.03  # bf16 keeps 8 bits: ~0.4 % a product, five iterations
    s = torch.linalg.svdvals(mine.double())
    assert 0.6 < s.min() and s.max() < 1.25
    assert torch.allclose(
        orthogonalize([g.T], batched=False)[0], mine.T, atol=1e-5
    )  # tall matrices go through the transpose
