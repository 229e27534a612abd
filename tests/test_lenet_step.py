"""The LeNet plan (lenet/plan.py) and the one training step (lenet/step.py).

- The plan: no `auto` survives resolution; `auto` picks cudagraph on CUDA only where the recipe
  permits; summary.json records the plan; a cudagraph request on a CPU is one line naming the flag.
- The step's modes against the eager step, the independent reference: compile on the CPU here, the
  CUDA graph on a GPU (marker `gpu`: skipped without one, and it fails, never skips, with one).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from trainlab.cli import main
from trainlab.errors import ConfigError
from trainlab.lenet.config import PRESETS, TrainConfig, apply_preset
from trainlab.lenet.ema import EMA
from trainlab.lenet.plan import LeNetPlan, resolve
from trainlab.lenet.setup import build_model, build_optimizer, build_scheduler
from trainlab.lenet.step import Step, make_step

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _values(plan: LeNetPlan) -> list:
    return list(plan.to_dict().values())


# ----------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("preset", ["default", "fast", "best"])
@pytest.mark.parametrize("device", [CPU, CUDA])
def test_no_auto_survives_the_plan(preset, device):
    # resolve() reads the device's type only (no CUDA call), so the CUDA plan can be checked here
    plan = resolve(apply_preset(TrainConfig(device=str(device)), preset), device)
    assert "auto" not in _values(plan)
    assert plan.step_mode in ("eager", "compile", "cudagraph") and plan.precision in ("bf16", "fp16", "fp32")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.step_mode = "eager"  # frozen: nothing re-decides it later


def test_auto_step_mode_is_cudagraph_for_the_fast_recipe_on_cuda_only():
    fast = apply_preset(TrainConfig(), "fast")
    cuda = resolve(fast, CUDA)
    assert (cuda.step_mode, cuda.capturable, cuda.ops, cuda.precision, cuda.channels_last) == (
        "cudagraph",
        True,  # Muon (lenet.muon) steps inside the graph
        "aten",
        "bf16",
        True,
    )
    assert resolve(fast, CPU).step_mode == "eager" and not resolve(fast, CPU).capturable
    assert cuda.optimizer_in_graph
    # with AdamW (the recipe before issue 40) the whole step is in the graph
    adamw = resolve(dataclasses.replace(fast, optimizer="adamw"), CUDA)
    assert adamw.step_mode == "cudagraph" and adamw.capturable and adamw.optimizer_in_graph
    # the default recipe graphs too: forward + backward captured, the fused AdamW step after each replay
    # (OneCycle's beta1 is a host float the fused kernel takes as an argument, frozen if captured)
    default = resolve(TrainConfig(), CUDA)
    assert (default.step_mode, default.capturable, default.fused_optimizer, default.optimizer_in_graph) == (
        "cudagraph",
        False,
        True,
        False,
    )
    assert resolve(TrainConfig(), CPU).step_mode == "eager"
    assert resolve(TrainConfig(compile=True), CUDA).step_mode == "compile"
    assert resolve(dataclasses.replace(fast, parallel="ddp"), CUDA).step_mode == "eager"
    assert (
        resolve(dataclasses.replace(fast, act="gelu-cuda"), CUDA).step_mode == "eager"
    )  # our kernels: not graphed by auto


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"device": "cpu"}, "--step-mode cudagraph: CUDA graphs need a CUDA device"),
        ({"optimizer": "sgd"}, "--step-mode cudagraph: not with --optimizer sgd"),
        ({"compile": True}, "--step-mode cudagraph: conflicts with --compile"),
    ],
)
def test_a_cudagraph_request_the_recipe_cannot_honour_names_the_flag(changes, needle):
    cfg = dataclasses.replace(TrainConfig(schedule="linear", step_mode="cudagraph"), **changes)
    with pytest.raises(ConfigError, match=needle):
        resolve(cfg, torch.device(cfg.device) if cfg.device == "cpu" else CUDA)


def test_cudagraph_on_a_cpu_is_one_line_and_no_run_directory(tmp_path, capsys):
    assert main(["train", "--device", "cpu", "--step-mode", "cudagraph", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "trainlab: error: --step-mode cudagraph: CUDA graphs need a CUDA device, not cpu (use --step-mode eager "
        + "or compile)"
    ]
    assert not (tmp_path / "r").exists()


def test_summary_records_the_resolved_plan(tmp_path):
    from trainlab.lenet.loop import train

    batch = PRESETS["fast"]["batch_size"]
    cfg = apply_preset(
        TrainConfig(
            device="cpu",
            train_subset=2 * batch,
            test_subset=100,
            progress=False,
            tensorboard=False,
            gpu_telemetry=False,
            out=str(tmp_path / "r"),
        ),
        "fast",
    )
    cfg.ops = "aten"  # the fused C++ stage would build its extension: not what this test is about
    summary = train(cfg, log=lambda *a: None)
    recorded = json.loads((tmp_path / "r" / "summary.json").read_text())
    resolved = recorded["plan"]["resolved"]  # the result record's plan holds the LeNetPlan as it ran
    assert resolved == resolve(cfg, CPU).to_dict() == summary["plan"]
    assert "auto" not in resolved.values() and recorded["ops"] == resolved["ops"]
    assert recorded["kind"] == "lenet_train" and recorded["plan"]["dataset"] == {
        "name": "mnist",
        "train": 2 * batch,
        "test": 100,
    }
    assert recorded["step_mode"] == "eager" and recorded["steps"] == 2 and recorded["batch_size"] == batch
    # data loading, preparation and evaluation are reported apart from the timed training
    assert all(recorded[k] >= 0 for k in ("data_seconds", "warmup_seconds", "eval_seconds", "train_seconds"))
    assert recorded["ms_per_step"] == pytest.approx(1e3 * recorded["train_seconds"] / 2)


# ----------------------------------------------------------------------------- the step's modes


def _run(plan: LeNetPlan, batches, steps_per_epoch: int) -> tuple[list[float], dict]:
    """Train `plan`'s model through the library's step on `batches` → (per-step losses, final weights and,
    under `ema.` keys, their EMA: in a captured graph it moves inside the graph)."""
    model = build_model(plan)
    optimizer = build_optimizer(plan, model)
    scheduler = build_scheduler(plan, optimizer, plan.lr, steps_per_epoch)
    ema = EMA(model, 0.9)
    step = make_step(plan, model, optimizer, ema=ema)
    step.prepare(*batches[0])
    losses, correct = [], []
    for x, y in batches:
        loss, n = step(x, y)
        scheduler.step()
        losses.append(loss)
        correct.append(n)
    states = {**model.state_dict(), **{f"ema.{k}": v for k, v in ema.module.state_dict().items()}}
    assert ema.updates == len(batches) == int(ema._count)
    return [float(v) for v in losses], {k: v.detach().float().cpu() for k, v in states.items()}


def _batches(device, n: int, batch: int, channels_last: bool):
    from trainlab.data.loader import DeviceLoader
    from trainlab.data.mnist import load_mnist

    data = load_mnist(None)
    loader = DeviceLoader(data.train_images[:n], data.train_labels[:n], batch, device, shuffle=False)
    return [(x.contiguous(memory_format=torch.channels_last) if channels_last else x, y) for x, y in loader]


# eager and compile run the same arithmetic in different kernels (inductor fuses and reorders): after 6
# AdamW steps at lr 1e-2 the float32 results agree to ~1e-6; 1e-4 leaves room and still catches a
# step that differs (a missed update moves a weight by ~lr = 1e-2).
COMPILE_TOL = 1e-4


@pytest.mark.slow
def test_compile_step_matches_the_eager_step_on_cpu():
    base = TrainConfig(
        device="cpu",
        batchnorm=True,
        schedule="linear",
        warmup_epochs=0.5,
        lr=1e-2,
        label_smoothing=0.1,
        amp="off",
        channels_last="off",
        epochs=1,
    )
    batches = _batches(CPU, 6 * 32, 32, channels_last=False)
    eager_losses, eager_w = _run(resolve(base, CPU), batches, len(batches))
    compiled_losses, compiled_w = _run(
        resolve(dataclasses.replace(base, step_mode="compile"), CPU), batches, len(batches)
    )
    assert eager_losses == pytest.approx(compiled_losses, rel=COMPILE_TOL, abs=COMPILE_TOL)
    assert eager_losses[0] != pytest.approx(eager_losses[-1], abs=1e-3)  # it trained
    for k in eager_w:
        torch.testing.assert_close(compiled_w[k], eager_w[k], rtol=COMPILE_TOL, atol=COMPILE_TOL, msg=k)


def test_eager_step_equals_the_written_out_step():
    """The step against an independent hand-written one: forward, smoothed cross-entropy, backward, AdamW."""
    import torch.nn.functional as F

    cfg = TrainConfig(device="cpu", label_smoothing=0.1, amp="off", channels_last="off")
    plan = resolve(cfg, CPU)
    batches = _batches(CPU, 3 * 16, 16, channels_last=False)
    model, ref = build_model(plan), build_model(plan)
    step = make_step(plan, model, build_optimizer(plan, model))
    # the same torch AdamW kernel as the plan (fused or not): AdamW divides by sqrt(v), so where a gradient is ~0
    # two kernels' rounding differs by more than 1e-6 after a few steps; the step under test is the rest
    opt = torch.optim.AdamW(ref.parameters(), lr=plan.lr, weight_decay=plan.weight_decay, fused=plan.fused_optimizer)
    for x, y in batches:
        loss, correct = step(x, y)
        logits = ref(x)
        ref_loss = F.cross_entropy(logits, y, label_smoothing=0.1)
        opt.zero_grad()
        ref_loss.backward()
        opt.step()
        assert float(loss) == pytest.approx(ref_loss.item(), rel=1e-5)
        assert int(correct) == int((logits.argmax(1) == y).sum())
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_prepare_leaves_model_and_optimizer_as_they_were():
    plan = resolve(TrainConfig(device="cpu", step_mode="compile", batchnorm=True, amp="off", channels_last="off"), CPU)
    model = build_model(plan)
    ema = EMA(model, 0.9)
    step = make_step(plan, model, build_optimizer(plan, model), ema=ema)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with step.preserved():  # what prepare() and the plan line's timing wrap steps in, here full optimizer steps
        for x, y in _batches(CPU, 64, 32, channels_last=False):
            step.eager(x, y)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not step.optimizer.state and all(p.grad is None for p in model.parameters())
    # the EMA too: its average, its host count and its device count (which the next update reads)
    assert all(torch.equal(before[k], v) for k, v in ema.module.state_dict().items())
    assert ema.updates == 0 and float(ema._count) == 0


class _ReplayOnCPU:
    """Stands in for a captured CUDA graph with the optimizer outside it (OneCycle): `replay()` runs
    forward + backward on the step's static buffers and writes the loss, the correct count and the
    gradients INTO the tensors the capture left (as a replay does), never touching `p.grad`."""

    def __init__(self, step):
        self.step = step
        params = [p for p in step.module.parameters()]
        step.static_loss, step.static_correct = torch.zeros(()), torch.zeros((), dtype=torch.long)
        self.grads = [torch.zeros_like(p) for p in params]
        step.graph_grads = list(zip(params, self.grads))

    def replay(self):
        s = self.step
        logits = s.model(s.static_x)
        loss = torch.nn.functional.cross_entropy(logits.float(), s.static_y, label_smoothing=s.plan.label_smoothing)
        with torch.no_grad():
            for g, new in zip(self.grads, torch.autograd.grad(loss, [p for p, _ in s.graph_grads])):
                g.copy_(new)
            s.static_loss.copy_(loss)
            s.static_correct.copy_((logits.argmax(1) == s.static_y).sum())


def test_a_graph_step_with_the_optimizer_outside_runs_it_after_each_replay_like_eager():
    """The default recipe's graphed step (optimizer outside the graph) against the eager step, on the CPU:
    a replay stand-in writes the gradients where a graph would, the fused AdamW step runs after it under
    torch's own OneCycleLR (beta1 cycled per step), and a short batch between replays (which sets .grad
    to None) must not leave the next replays' updates unapplied."""
    cfg = TrainConfig(device="cpu", amp="off", channels_last="off", epochs=1, label_smoothing=0.1)
    plan = resolve(cfg, CPU)
    graphed = dataclasses.replace(plan, step_mode="cudagraph", capturable=resolve(cfg, CUDA).capturable)
    assert not graphed.optimizer_in_graph and not graphed.capturable
    batches = _batches(CPU, 5 * 32 + 16, 32, channels_last=False)
    batches = batches[:3] + batches[-1:] + batches[3:-1]  # a short batch between full ones
    runs = {}
    for name, p in (("eager", plan), ("graphed", graphed)):
        model = build_model(p)
        optimizer = build_optimizer(p, model)
        scheduler = build_scheduler(p, optimizer, p.lr, len(batches))
        step = Step(p, model, optimizer)  # make_step refuses cudagraph on a CPU
        if name == "graphed":
            step.static_x, step.static_y = batches[0][0].clone(), batches[0][1].clone()
            step.graph = _ReplayOnCPU(step)
        losses, beta1 = [], []
        for x, y in batches:
            loss, _ = step(x, y)
            scheduler.step()
            losses.append(float(loss))
            beta1.append(optimizer.param_groups[0]["betas"][0])
        runs[name] = losses, beta1, [q.detach().clone() for q in model.parameters()]
    assert runs["graphed"][0] == pytest.approx(runs["eager"][0], rel=1e-5)
    assert runs["graphed"][1] == runs["eager"][1]
    assert len(set(runs["eager"][1])) > 3  # beta1 cycled, same values
    for a, b in zip(runs["graphed"][2], runs["eager"][2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _hand_ema(expected: dict, model, d: float) -> None:
    """One EMA update written out in float64: floating tensors averaged, integer buffers copied."""
    for k, live in model.state_dict().items():
        expected[k] = d * expected[k] + (1 - d) * live.double() if live.dtype.is_floating_point else live.double()


@pytest.mark.parametrize("mode", ["eager", "graphed"])
def test_the_step_moves_the_ema_after_each_optimizer_step_as_written_out(mode):
    """`--ema` through the step: after every optimizer step (replayed or eager, a short batch between
    replays included) the average is the hand-computed one of the live weights and BatchNorm statistics,
    d_t = min(decay, (1 + t)/(10 + t)), and the host's count equals the device's. `graphed`: a stand-in
    for a captured graph holding the whole step (fast's linear schedule) runs the step and the EMA's
    device work (`advance`), as the capture records them; the step must then only count it."""
    cfg = TrainConfig(device="cpu", batchnorm=True, schedule="linear", amp="off", channels_last="off", epochs=1)
    plan = resolve(cfg, CPU)
    if mode == "graphed":
        plan = dataclasses.replace(plan, step_mode="cudagraph", capturable=True)
        assert plan.optimizer_in_graph
    batches = _batches(CPU, 10 * 16 + 8, 16, channels_last=False)
    batches = batches[:4] + batches[-1:] + batches[4:-1]  # a short batch between full ones
    model = build_model(plan)
    ema = EMA(model, decay=0.5)  # the ramp reaches 0.5 at t = 8: both regimes within the 11 steps
    step = Step(plan, model, build_optimizer(plan, model), ema=ema)  # make_step refuses cudagraph on a CPU
    if mode == "graphed":
        step.static_x, step.static_y = batches[0][0].clone(), batches[0][1].clone()
        step.graph = _WholeStepReplayOnCPU(step)
    expected = {k: v.double().clone() for k, v in model.state_dict().items()}
    for t, (x, y) in enumerate(batches):
        step(x, y)
        _hand_ema(expected, model, min(0.5, (1 + t) / (10 + t)))
    assert ema.updates == len(batches) == int(ema._count)
    assert mode == "eager" or step.graph.replays == len(batches) - 1  # all but the short batch replayed
    for k, v in ema.module.state_dict().items():
        torch.testing.assert_close(v.double(), expected[k], rtol=1e-5, atol=1e-6, msg=k)
    assert not torch.equal(ema.module.classifier[-1].weight, model.classifier[-1].weight)  # an average, not a copy


class _WholeStepReplayOnCPU:
    """Stands in for a captured graph that holds the whole step (optimizer and EMA inside): `replay()`
    runs what `Step._capture` records, on the static buffers."""

    def __init__(self, step):
        self.step, self.replays = step, 0

    def replay(self):
        s = self.step
        s.optimizer.zero_grad(set_to_none=True)
        s.static_loss, s.static_correct = s.forward_backward(s.static_x, s.static_y)
        s.optimizer.step()
        s.ema.advance()
        self.replays += 1


# A CUDA graph replays the eager step's kernels: the same arithmetic, so the results agree to float32
# rounding (cuDNN may pick another algorithm during capture). 1e-4 over 12 steps at lr 1e-2, and a
# missed or stale update (a frozen lr, an un-copied batch) is off by ~1e-2.
GRAPH_TOL = 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("amp, tol", [("off", GRAPH_TOL), ("bf16", 2e-2)])
@pytest.mark.parametrize("recipe", ["linear", "fast", "default"])
def test_cudagraph_steps_match_eager_steps(amp, tol, recipe):
    """`linear`: the whole step in the graph (fused capturable AdamW). `fast`: the preset's, Muon's step (its
    batched Newton–Schulz) and its fused AdamW half in the graph. `default`: OneCycle AdamW with beta1
    cycled per step, graphed forward + backward and the fused step after each replay (`auto` picks it)."""
    base = {
        "linear": TrainConfig(
            device="cuda",
            batchnorm=True,
            batchnorm_conv1=False,
            schedule="linear",
            warmup_epochs=0.3,
            lr=1e-2,
            label_smoothing=0.1,
            channels_last="on",
            epochs=1,
        ),
        "fast": apply_preset(TrainConfig(device="cuda", channels_last="on", epochs=1), "fast"),
        "default": TrainConfig(device="cuda", channels_last="on", epochs=1),
    }[recipe]
    base = dataclasses.replace(base, amp=amp)
    # 11 full batches of 64 and a last one of 32: graphed, then the short one eagerly through the same step
    batches = _batches(CUDA, 11 * 64 + 32, 64, channels_last=True)
    eager = resolve(dataclasses.replace(base, step_mode="eager"), CUDA)
    graphed = resolve(base, CUDA)  # auto
    assert graphed.step_mode == "cudagraph" and graphed.optimizer_in_graph == (recipe != "default")
    assert graphed.optimizer == ("muon" if recipe == "fast" else "adamw")
    # The same arithmetic on both sides (issue 35: 1.4e-4, then 1.4e-3 apart on an H200 otherwise): the eager
    # run steps the capturable fused AdamW the graph holds (bias correction on the device in fp32, not on the
    # host in double), and cuDNN picks its deterministic algorithms by heuristics in both runs, not by timing
    # or atomics. AdamW turns rounding-level differences of near-zero gradients into steps of up to lr.
    eager = dataclasses.replace(eager, capturable=graphed.capturable)
    cudnn = torch.backends.cudnn
    with cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=cudnn.allow_tf32):
        eager_losses, eager_w = _run(eager, batches, len(batches))
        graph_losses, graph_w = _run(graphed, batches, len(batches))
    assert graph_losses == pytest.approx(eager_losses, rel=tol, abs=tol)
    assert eager_losses[0] != pytest.approx(eager_losses[-1], abs=1e-2)  # it trained
    for k in eager_w:
        torch.testing.assert_close(graph_w[k], eager_w[k], rtol=tol, atol=tol, msg=k)


@pytest.mark.gpu
def test_fast_preset_on_cuda_trains_with_the_graphed_step(tmp_path):
    from trainlab.lenet.loop import train

    cfg = apply_preset(
        TrainConfig(
            device="cuda",
            train_subset=PRESETS["fast"]["batch_size"] * 20 + 40,  # 20 full steps and a short last one
            test_subset=1000,
            progress=False,
            tensorboard=False,
            gpu_telemetry=False,
            out=str(tmp_path / "r"),
        ),
        "fast",
    )
    summary = train(cfg, log=lambda *a: None)
    assert summary["step_mode"] == "cudagraph" and summary["steps"] == 21
    assert summary["test_accuracy"] > 50  # ~2,000 images, one epoch: it learned (chance is 10 %)
    assert summary["warmup_seconds"] > 0  # the capture, reported apart


@pytest.mark.gpu
def test_default_recipe_on_cuda_trains_with_the_graphed_step(tmp_path):
    """OneCycle's graphed step through the loop: a short last batch each epoch runs eagerly (setting .grad to
    None) between replays, and the next epoch's replays must still update the weights."""
    from trainlab.lenet.loop import train

    cfg = TrainConfig(
        device="cuda",
        epochs=2,
        train_subset=256 * 8 + 40,
        test_subset=1000,
        progress=False,
        tensorboard=False,
        gpu_telemetry=False,
        out=str(tmp_path / "r"),
    )
    summary = train(cfg, log=lambda *a: None)
    assert summary["step_mode"] == "cudagraph" and not summary["plan"]["capturable"] and summary["steps"] == 18
    assert (
        summary["test_accuracy"] > 40
    )  # ~2,000 images, two epochs of OneCycle: ~70 % on a CPU in eager mode (chance 10 %)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["fast", "default"])
def test_graphed_steps_never_sync_the_host(preset):
    """Issue 29: the time-to-99 step runs with no host sync per step (a sync makes the GPU wait for Python)."""
    plan = resolve(apply_preset(TrainConfig(device="cuda"), preset), CUDA)
    assert plan.step_mode == "cudagraph"
    batches = _batches(CUDA, 6 * plan.batch_size, plan.batch_size, channels_last=plan.channels_last)
    model = build_model(plan)
    optimizer = build_optimizer(plan, model)
    scheduler = build_scheduler(plan, optimizer, plan.lr, len(batches))
    step = make_step(plan, model, optimizer, ema=EMA(model, 0.99))  # its update too: in the graph, or after it
    step.prepare(*batches[0])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call below raises
    try:
        for x, y in batches:
            step(x, y)
            scheduler.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
