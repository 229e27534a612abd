"""Issue 35's glue levers, each a plan field proved on the CPU against the plain model: the fused block boundary
(fp32, eager and compiled, several AdamW steps with accumulation), the 16-bit weights cast once per optimizer
step (bf16 autocast: autocast's own rounding, so equal to the plain amp path), the 16-bit residual stream
(against an fp32 reference within a tolerance derived from bf16's rounding), and `--loss auto` (the planner's
choice, shown in the plan)."""

from dataclasses import replace

import pytest
import torch
from gpt_plans import make_plan

from trainlab.distributed.launch import DistInfo
from trainlab.errors import ConfigError
from trainlab.gpt.engine import GPTEngine
from trainlab.gpt.model import LayerNorm, build_gpt, cast_weights_once, lm_loss
from trainlab.gpt.plan import Machine
from trainlab.gpt.planner import format_plan, predict_memory, predict_plan
from trainlab.gpt.shape import GPTConfig, get_preset

ODD = GPTConfig(vocab_size=500, n_positions=32, n_embd=40, n_layer=3, n_head=4)
TOKENS = torch.randint(500, (3, 16), generator=torch.Generator().manual_seed(0))
TOL = dict(rtol=1e-6, atol=1e-7)  # fp32: the same ops in the same order (compiled: inductor's reordering)
U = 2.0**-8  # bf16's unit roundoff (8 significant bits)


def _grads(model, amp=False):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        loss = lm_loss(model(TOKENS), TOKENS)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _trained(plan, steps=3):
    engine = GPTEngine(plan, DistInfo())
    gen = torch.Generator().manual_seed(1)
    losses = [engine.train_step(torch.randint(500, (plan.global_batch, plan.seq), generator=gen)) for _ in range(steps)]
    return losses, engine.full_state_dict()


# three AdamW steps (weight decay on), two micro-steps each
ACCUM = dict(global_batch=4, micro_batch=2, seq_len=16, weight_decay=0.1)


# ---------------------------------------------------------------------------------------------- LayerNorm


def test_layer_norm_keeps_fp32_statistics_for_a_16bit_input_and_is_nn_layernorm_on_fp32():
    ln = LayerNorm(40)
    torch.nn.init.normal_(ln.weight)
    x = 100 + torch.randn(6, 40)  # a large mean: bf16 statistics would lose the variance to cancellation
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = ln(x.bfloat16())
        y32 = ln(x)
    ref = torch.nn.functional.layer_norm(x.bfloat16().float(), (40,), ln.weight, ln.bias, 1e-5)
    assert y16.dtype == torch.bfloat16 and torch.equal(y16, ref.bfloat16())  # one rounding, of the fp32 result
    assert torch.equal(y32, torch.nn.LayerNorm.forward(ln, x))


# ---------------------------------------------------------------------------------------------- fused boundary


def test_fused_boundary_is_the_unfused_model_in_fp32():
    l0, g0 = _grads(build_gpt(ODD, 0))
    l1, g1 = _grads(build_gpt(replace(ODD, fused_boundary=True), 0))
    assert torch.equal(l1, l0)  # the same ops in the same order: equal to the bit
    for n in g0:
        assert torch.equal(g1[n], g0[n]), n


@pytest.mark.parametrize("ckpt", ["", "+ckpt", "+ckpt-selective"])
def test_fused_boundary_plan_trains_like_the_plain_plan_with_adamw_and_accumulation(ckpt):
    plain = make_plan(ODD, "accum" + ckpt, **ACCUM)
    fused = make_plan(ODD, "accum" + ckpt, **ACCUM, fused_boundary=True)
    assert fused.model.fused_boundary and fused.describe()["fused_boundary"]
    base_losses, base = _trained(plain)
    losses, sd = _trained(fused)
    assert losses == pytest.approx(base_losses, rel=1e-6)
    for n in base:
        torch.testing.assert_close(sd[n], base[n], **TOL, msg=lambda m: f"{n}: {m}")


def _sgd_steps(cfg, amp=False, cache=False, compiled=False, steps=2):
    """Two SGD steps of `cfg` (blocks compiled as the engine compiles them, if asked): losses and gradients."""
    torch._dynamo.reset()
    model = build_gpt(cfg, 0)
    if cache:
        cast_weights_once(model, torch.bfloat16)
    if compiled:
        for block in model.h.values():
            block.forward = torch.compile(block.forward)
    out = []
    for _ in range(steps):
        loss, grads = _grads(model, amp)
        out.append((loss, {n: g.clone() for n, g in grads.items()}))
        with torch.no_grad():  # an in-place update: the weight cache must see it
            for p in model.parameters():
                p.sub_(0.1 * p.grad)
        model.zero_grad(set_to_none=True)
    return out


@pytest.mark.timeout(600)
def test_fused_boundary_under_compile_equals_the_unfused_eager_model():
    """Inductor fuses the add and the LayerNorm inside one block's graph; the function is the same (fp32)."""
    cfg = replace(ODD, n_layer=2)
    ref = _sgd_steps(cfg)
    got = _sgd_steps(replace(cfg, fused_boundary=True), compiled=True)
    for (l0, g0), (l1, g1) in zip(ref, got):
        torch.testing.assert_close(l1, l0, rtol=1e-6, atol=0)
        for n in g0:
            torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-6, msg=lambda m: f"{n}: {m}")


# ---------------------------------------------------------------------------------------------- cast once


def test_cast_once_plan_is_the_plain_amp_plan_to_the_bit_with_one_cast_per_optimizer_step(monkeypatch):
    """bf16 autocast, three AdamW steps of two micro-steps: the cached copies are autocast's rounding of the
    fp32 weights and the gradient reaches the fp32 weight as autocast's cast hands it on, so the losses and
    weights are the plain amp plan's exactly; the copies are made once per optimizer step, not per micro-step."""
    plain = make_plan(ODD, "amp+accum", **ACCUM)
    once = make_plan(ODD, "amp+accum", **ACCUM, cast_once=True)
    assert once.cast_once and once.describe()["cast_once"] and once.micro_steps == 2
    copies = []
    real = torch._foreach_copy_
    monkeypatch.setattr(torch, "_foreach_copy_", lambda dst, src: copies.append(len(dst)) or real(dst, src))
    base_losses, base = _trained(plain)
    losses, sd = _trained(once)
    assert copies == [2 * 6 * ODD.n_layer] * 3  # every block Linear's weight and bias, once per optimizer step
    assert losses == base_losses
    for n in base:
        assert torch.equal(sd[n], base[n]), n


def test_cast_once_weights_get_fp32_gradients_and_fp32_forward_is_untouched():
    model = build_gpt(ODD, 0)
    assert cast_weights_once(model, torch.bfloat16) == 6 * ODD.n_layer
    l_amp, g_amp = _grads(build_gpt(ODD, 0), amp=True)
    l1, g1 = _grads(model, amp=True)
    assert torch.equal(l1, l_amp) and all(torch.equal(g1[n], g_amp[n]) for n in g_amp)
    assert g1["h.0.mlp.fc.weight"].dtype == torch.float32
    model.zero_grad()
    l0, g0 = _grads(build_gpt(ODD, 0))
    l2, g2 = _grads(model)  # no autocast: the fp32 weights themselves
    assert torch.equal(l2, l0) and all(torch.equal(g2[n], g0[n]) for n in g0)


@pytest.mark.timeout(600)
def test_cast_once_under_compile_follows_the_weights_and_matches_compiled_autocast():
    """Compiled blocks read the copies as graph inputs; after an in-place update the next step sees the new
    weights (a stale copy would give the second step other gradients than compiled autocast's)."""
    cfg = replace(ODD, n_layer=2)
    ref = _sgd_steps(cfg, amp=True, compiled=True)
    got = _sgd_steps(cfg, amp=True, cache=True, compiled=True)
    for (l0, g0), (l1, g1) in zip(ref, got):
        torch.testing.assert_close(l1, l0, rtol=4 * U, atol=0)
        for n in g0:
            err = (g1[n] - g0[n]).abs().max() / g0[n].abs().max().clamp_min(1e-12)
            assert err <= 4 * U, (n, float(err))
    assert not torch.equal(got[0][0], got[1][0])


# ---------------------------------------------------------------------------------------------- 16-bit residual


def test_residual_16bit_is_bf16_between_blocks_and_within_bf16_rounding_of_fp32():
    """Tolerance derived from bf16: the residual is rounded once at the embedding and once per residual add
    (2L + 1 roundings of at most U/2 each); with backward's as many again, (2L + 1)·U relative to each tensor's
    max, on top of what the plain amp path's own bf16 GEMMs already move (measured here too)."""
    cfg = replace(ODD, residual_16bit=True)
    model = build_gpt(cfg, 0)
    dtypes = []
    model.h["1"].register_forward_hook(lambda m, i, o: dtypes.append((i[0].dtype, o.dtype)))
    l16, g16 = _grads(model, amp=True)
    assert dtypes == [(torch.bfloat16, torch.bfloat16)]
    l32, g32 = _grads(build_gpt(ODD, 0))
    l_amp, g_amp = _grads(build_gpt(ODD, 0), amp=True)
    tol = (2 * ODD.n_layer + 1) * U
    torch.testing.assert_close(l16, l32, rtol=tol, atol=0)
    for n in g32:
        # a key bias gets no gradient in exact math (softmax is shift-invariant per query): its layer's key weight
        # gradient is the scale of its rounding noise (as test_gpt_levers' GPU check)
        scale = (g32[n.replace("bias", "weight")] if n.endswith("k_proj.bias") else g32[n]).abs().max()
        amp_err = float((g_amp[n] - g32[n]).abs().max() / scale)
        err = float((g16[n] - g32[n]).abs().max() / scale)
        assert err <= amp_err + tol, (n, err, amp_err)
    l_plain, g_plain = _grads(build_gpt(cfg, 0))  # no autocast: the lever does nothing
    assert torch.equal(l_plain, l32) and all(torch.equal(g_plain[n], g32[n]) for n in g32)


def test_residual_16bit_plan_trains_within_bf16_of_the_fp32_plan():
    ref_losses, _ = _trained(make_plan(ODD, "accum", **ACCUM))
    amp_losses, _ = _trained(make_plan(ODD, "amp+accum", **ACCUM))
    losses, _ = _trained(make_plan(ODD, "amp+accum", **ACCUM, residual_16bit=True))
    tol = (2 * ODD.n_layer + 1) * U
    for got, amp, ref in zip(losses, amp_losses, ref_losses):
        assert abs(got - ref) <= abs(amp - ref) + tol * ref


GPT_BEST_GLUE = dict(
    vocab_multiple=64, fused_qkv=True, loss="auto", residual_16bit=True, fused_boundary=True, cast_once=True
)


def _glue_within_bf16(device: str, compiled: str) -> None:
    """gpt_best's levers (lab.plan.best_levers under bf16) train within bf16 rounding of the fp32 plan, as
    far from it as the plain amp plan is, plus the residual's rounding."""
    ref_losses, _ = _trained(make_plan(ODD, "accum", device=device, **ACCUM))
    amp_losses, _ = _trained(make_plan(ODD, "amp+accum" + compiled, device=device, **ACCUM))
    losses, _ = _trained(make_plan(ODD, "amp+accum" + compiled, device=device, **ACCUM, **GPT_BEST_GLUE))
    tol = (2 * ODD.n_layer + 1) * U
    for got, amp, ref in zip(losses, amp_losses, ref_losses):
        assert abs(got - ref) <= abs(amp - ref) + tol * ref, (got, amp, ref)


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_gpt_best_levers_on_cuda_compiled_train_within_bf16_of_fp32():
    """What the H200 ran as gpt_best (2026-11-28): every lever together, compiled, on the GPU."""
    torch._dynamo.reset()
    _glue_within_bf16("cuda", "+compile")


# ---------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "strategy,flags,match",
    [
        ("accum", dict(residual_16bit=True), "--residual-16bit: needs amp"),
        ("accum", dict(cast_once=True), "--cast-once: needs amp"),
        ("amp+zero3", dict(fused_boundary=True, world=2), "--fused-boundary: single device or ddp only"),
        ("amp+zero2", dict(cast_once=True, world=2), "--cast-once: single device or ddp only"),
        ("amp+tp", dict(cast_once=True, world=2), "--cast-once: single device or ddp only"),
        ("amp+pp", dict(residual_16bit=True, world=2), "--residual-16bit: not with pp"),
        ("amp", dict(residual_16bit=True, impl="hf"), "--residual-16bit: a lever of our model"),
    ],
)
def test_glue_levers_refuse_what_they_cannot_do(strategy, flags, match):
    with pytest.raises(ConfigError, match=match):
        make_plan("tiny", strategy, global_batch=4, micro_batch=2, **flags)


def test_glue_levers_round_trip_in_the_plan():
    from trainlab.gpt.plan import GPTPlan

    p = make_plan(ODD, "amp+accum", **ACCUM, residual_16bit=True, fused_boundary=True, cast_once=True)
    assert GPTPlan.from_dict(p.to_dict()) == p


# ---------------------------------------------------------------------------------------------- planner


def test_planner_halves_the_residual_and_holds_the_weight_copies_all_step():
    big = get_preset("gpt2-1.6b")
    kw = dict(micro_batch=8, optimizer="fused")
    plain = predict_memory(big, "amp", **kw)
    res16 = predict_memory(replace(big, residual_16bit=True), "amp", **kw)
    # per token and layer the two LayerNorm inputs are 2 bytes instead of 4, and ln_f's input at the head
    tokens, h, L = 8 * 1024, 1600, 48
    assert plain["activations_bytes"] - res16["activations_bytes"] == tokens * h * (2 * 2 * L + 2)
    once = predict_memory(big, "amp", **kw, cast_once=True)
    copies = 2 * L * (12 * h * h + 9 * h)  # q, k, v, o, fc, proj weights and biases in bf16
    assert plain["activations_bytes"] - once["activations_bytes"] == copies  # no longer saved per layer...
    assert once["buffers_bytes"] == copies  # ...but held through the optimizer step
    assert once["phase_bytes"]["optimizer_step"] - plain["phase_bytes"]["optimizer_step"] == copies


@pytest.mark.parametrize("flags", [dict(residual_16bit=True), dict(cast_once=True)], ids=["res16", "once"])
def test_glue_prediction_matches_measured_peak(flags):
    """Live tensor bytes on the CPU (exact), as test_gpt_levers does for the chunked loss; tiny, seq 64, amp."""
    from trainlab.gpt.planner import measure_step_peak_bytes

    cfg = replace(get_preset("tiny"), vocab_size=500)
    plan = make_plan(cfg, "amp+accum", global_batch=8, micro_batch=4, seq_len=64, **flags)
    tokens = torch.randint(500, (8, 64), generator=torch.Generator().manual_seed(0))
    measured = measure_step_peak_bytes(GPTEngine(plan, DistInfo()), tokens)
    predicted = predict_plan(plan)["total_bytes"]
    assert abs(predicted / measured - 1) < 0.12, (predicted, measured)


def test_cast_once_saves_the_recast_of_each_extra_micro_step_in_the_time_estimate():
    from trainlab.gpt.config import GPTBenchConfig

    h100 = Machine(gpus=1, sm=90, cudnn_version=92000, memory_bytes=80 * 2**30)
    run = GPTBenchConfig(model="gpt2-1.6b", strategy="amp+accum", device="cuda", global_batch=16, micro_batch=4)
    plain, once = run.plan(h100), replace(run, cast_once=True).plan(h100)
    n = 1_557_611_200  # 3 micro-steps beyond the first, 6 bytes a parameter each, at the H100's bandwidth
    assert plain.predicted_step_ms - once.predicted_step_ms == pytest.approx(1e3 * 3 * 6 * n / 3.35e12, abs=0.01)


# ---------------------------------------------------------------------------------------------- loss auto


def test_loss_auto_keeps_the_whole_logits_where_they_fit_and_chunks_where_only_that_fits():
    from trainlab.gpt.config import GPTBenchConfig
    from trainlab.gpt.planner import predicted_peak

    run = GPTBenchConfig(model="tiny", device="cpu", global_batch=8, micro_batch=8, seq=64, vocab_multiple=64)
    whole = predicted_peak(replace(run, loss="cross_entropy").plan(Machine()))
    chunked = predicted_peak(replace(run, loss="chunked").plan(Machine()))
    assert chunked < whole
    assert run.loss == "auto"  # the default
    assert run.plan(Machine(memory_bytes=whole)).loss == "cross_entropy"
    tight = run.plan(Machine(memory_bytes=(whole + chunked) // 2))
    assert tight.loss == "chunked" and tight.describe()["loss"] == "chunked"
    assert run.plan(Machine()).loss == "cross_entropy"  # memory unknown: the plain loss
    hf = replace(run, impl="hf", vocab_multiple=1)
    assert hf.plan(Machine(memory_bytes=chunked)).loss == "cross_entropy"  # the chunked loss is ours only


def test_gpt_plan_shows_the_loss_the_planner_chose():
    from trainlab.gpt.config import PlanConfig
    from trainlab.gpt.planner import parse_bytes, plan

    def table(mem):
        pc = PlanConfig(model="gpt2-1.6b", gpu_mem=mem, micro_batch=16, strategies="amp")
        return plan(pc.resolver(), 1, parse_bytes(mem), 16, ["amp"])

    roomy, tight = table("141GiB"), table("80GiB")
    assert roomy["strategies"][0]["loss"] == "cross_entropy" and tight["strategies"][0]["loss"] == "chunked"
    assert " chunked " in format_plan(tight)
