"""`--optimizer manual-sgd | manual-adamw` (lenet/manual_optim.py) against torch.optim, step by step.

The reference is torch's own single-tensor loop (foreach=False, fused=False), an independent
implementation of the same formulas: every parameter and every state tensor must agree after every
step, under a schedule that changes lr and β1/momentum between steps (OneCycle), and through a
state_dict round trip (resume). Then the hand-written all-reduce and ring modes train with them exactly
like one process does.
"""

from __future__ import annotations

import copy

import pytest
import torch

from trainlab.distributed.spawn import spawn_for_test
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train
from trainlab.lenet.manual_optim import ManualAdamW, ManualSGD
from trainlab.lenet.model import LeNet5
from trainlab.lenet.plan import resolve
from trainlab.lenet.setup import build_optimizer

STEPS = 12


def _pair(kind: str):
    torch.manual_seed(0)
    a = LeNet5()
    b = copy.deepcopy(a)
    if kind == "sgd":
        ref = torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3, foreach=False)
        mine = ManualSGD(b.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    else:
        ref = torch.optim.AdamW(a.parameters(), lr=3e-3, weight_decay=5e-2, foreach=False)
        mine = ManualAdamW(b.parameters(), lr=3e-3, weight_decay=5e-2)
    return a, ref, b, mine


def _train_steps(model, opt, sched, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
        yield


def _same(a, ref, b, mine, step):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=f"step {step}: {name} differs")
        for key, want in ref.state[p].items():
            torch.testing.assert_close(
                torch.as_tensor(mine.state[q][key]).float(), torch.as_tensor(want).float(), rtol=1e-6, atol=1e-7
            )


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_manual_update_equals_torch_optim_step_by_step(kind):
    a, ref, b, mine = _pair(kind)
    # OneCycle moves lr and cycles AdamW's β1 / SGD's momentum through param_groups every step
    s_ref = torch.optim.lr_scheduler.OneCycleLR(ref, max_lr=ref.param_groups[0]["lr"], total_steps=STEPS)
    s_mine = torch.optim.lr_scheduler.OneCycleLR(mine, max_lr=mine.param_groups[0]["lr"], total_steps=STEPS)
    start = [p.detach().clone() for p in a.parameters()]
    for step, _ in enumerate(zip(_train_steps(a, ref, s_ref, STEPS), _train_steps(b, mine, s_mine, STEPS))):
        _same(a, ref, b, mine, step)
    # guard: the steps moved the weights, so equal weights mean equal updates
    assert max((p - p0).abs().max().item() for p, p0 in zip(a.parameters(), start)) > 1e-3


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_a_wrong_update_would_be_caught(kind):
    # the comparison can fail: an AdamW without bias correction / an SGD without Nesterov differs
    a, ref, b, mine = _pair(kind)
    if kind == "sgd":
        mine = torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3, foreach=False)
    else:
        mine = torch.optim.AdamW(b.parameters(), lr=3e-3, weight_decay=5e-2, amsgrad=True, foreach=False)
    const = lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0)  # noqa: E731
    with pytest.raises(AssertionError):
        for step, _ in enumerate(zip(_train_steps(a, ref, const(ref), 4), _train_steps(b, mine, const(mine), 4))):
            _same(a, ref, b, mine, step)


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_state_dict_round_trip_resumes_exactly(kind):
    a, ref, b, mine = _pair(kind)
    const = lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0)  # noqa: E731
    for _ in zip(_train_steps(a, ref, const(ref), 3), _train_steps(b, mine, const(mine), 3)):
        pass
    c = copy.deepcopy(b)
    resumed = type(mine)(c.parameters(), lr=mine.param_groups[0]["lr"])
    resumed.load_state_dict(mine.state_dict())
    for _ in zip(_train_steps(a, ref, const(ref), 3, seed=2), _train_steps(c, resumed, const(resumed), 3, seed=2)):
        pass
    _same(a, ref, c, resumed, "after resume")


def test_the_plan_builds_the_manual_optimizer_unfused():
    for name, cls in (("manual-sgd", ManualSGD), ("manual-adamw", ManualAdamW)):
        plan = resolve(TrainConfig(optimizer=name, device="cpu"), torch.device("cpu"))
        assert not plan.fused_optimizer
        opt = build_optimizer(plan, LeNet5())
        assert type(opt) is cls and opt.param_groups[0]["weight_decay"] == plan.weight_decay


BASE = dict(
    epochs=1,
    train_subset=250,
    test_subset=100,
    batch_size=31,  # uneven shards over 2 ranks
    lr=0.05,
    device="cpu",
    progress=False,
    tensorboard=False,
    gpu_telemetry=False,
    seed=3,
)
DP_MODES = ("allreduce", "ring")


def _dp_job(info, tmp):
    for opt in ("manual-sgd", "manual-adamw"):
        for mode in DP_MODES:
            train(TrainConfig(**BASE, optimizer=opt, parallel=mode, out=f"{tmp}/{opt}-{mode}"), log=lambda *a: None)
    return info.rank


@pytest.mark.dist
def test_hand_written_dp_modes_train_with_the_manual_optimizer_like_one_process(tmp_path):
    spawn_for_test(_dp_job, 2, str(tmp_path), timeout_s=300)
    for opt in ("manual-sgd", "manual-adamw"):
        train(TrainConfig(**BASE, optimizer=opt, out=str(tmp_path / f"{opt}-single")), log=lambda *a: None)
        ref = torch.load(tmp_path / f"{opt}-single" / "checkpoint.pt", weights_only=False)
        assert ref["config"]["optimizer"] == opt
        for mode in DP_MODES:
            got = torch.load(tmp_path / f"{opt}-{mode}" / "checkpoint.pt", weights_only=False)
            for k in ref["model"]:
                torch.testing.assert_close(
                    got["model"][k], ref["model"][k], rtol=1e-4, atol=2e-5, msg=f"{opt} {mode}: {k}"
                )
            assert set(got["optimizer"]["state"][0]) == set(ref["optimizer"]["state"][0])


def test_the_flag_choices_name_every_hand_written_optimizer():
    """`--optimizer`'s choices are written out in lenet.config (building flags imports no torch); they must
    be the torch.optim names plus exactly the hand-written ones manual_optim implements."""
    from trainlab.lenet.config import OPTIMIZERS
    from trainlab.lenet.manual_optim import MANUAL_OPTIMIZERS

    assert OPTIMIZERS == ("adamw", "adam", "sgd", *MANUAL_OPTIMIZERS, "muon")  # muon: lenet.muon
