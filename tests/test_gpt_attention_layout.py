"""Issue 35's padded head layout (`--attention padN`, `GPTConfig.head_dim_padded`): q/k/v projected straight
into heads stored N wide with zero columns, SDPA at the real head_dim's scale, the output projection reading
the padded heads. Proved on the CPU in fp32 against the plain model (loss, gradients, several AdamW steps with
accumulation and weight decay), under ddp and zero3 on 2 gloo ranks, and against HF's GPT2LMHeadModel."""

import contextlib
from dataclasses import replace

import pytest
import torch
from gpt_plans import make_plan

from trainlab.distributed.launch import DistInfo
from trainlab.errors import ConfigError
from trainlab.gpt.engine import GPTEngine
from trainlab.gpt.model import (
    build_gpt,
    gpt_state_dict_from_hf,
    gpt_state_dict_to_hf,
    lm_loss,
    pad_heads_state_dict,
    strip_heads_state_dict,
)
from trainlab.gpt.plan import GPTPlan, Machine
from trainlab.gpt.planner import predict_memory, predict_plan
from trainlab.gpt.shape import GPTConfig, get_preset

# head_dim 10: not a multiple of 8, as GPT-2 1.6B's 50 is not
ODD = GPTConfig(vocab_size=500, n_positions=32, n_embd=40, n_layer=2, n_head=4)
PAD = replace(ODD, head_dim_padded=16)
TOKENS = torch.randint(500, (3, 16), generator=torch.Generator().manual_seed(0))
TOL = dict(rtol=1e-6, atol=1e-6)  # fp32: a wider GEMM reorders float sums only
H100 = Machine(gpus=1, sm=90, cudnn_version=92000, memory_bytes=80 * 2**30)


def _pad_columns(model) -> list[torch.Tensor]:
    """Every stored pad column of the padded layout (must stay exactly zero)."""
    out = []
    for block in model.h.values():
        attn = block.attn
        for name in ("qkv_proj", "q_proj", "k_proj", "v_proj"):
            for t in (getattr(attn, name).weight, getattr(attn, name).bias) if hasattr(attn, name) else ():
                out.append(t.view(-1, attn.head_width, *t.shape[1:])[:, attn.head_dim :])
        w = attn.o_proj.weight
        out.append(w.view(w.shape[0], -1, attn.head_width)[..., attn.head_dim :])
    return out


@pytest.mark.parametrize("fused", [False, True], ids=["qkv-apart", "fused-qkv"])
def test_padded_heads_give_the_plain_loss_and_gradients_with_zero_pad_gradients(fused):
    plain, padded = build_gpt(replace(ODD, fused_qkv=fused), 0), build_gpt(replace(PAD, fused_qkv=fused), 0)
    attn = padded.h["0"].attn
    proj = attn.qkv_proj if fused else attn.q_proj
    assert proj.weight.shape[0] == (3 if fused else 1) * 4 * 16 and attn.o_proj.weight.shape == (40, 64)
    l0, l1 = lm_loss(plain(TOKENS), TOKENS), lm_loss(padded(TOKENS), TOKENS)
    l0.backward()
    l1.backward()
    torch.testing.assert_close(l1, l0, **TOL)
    g0 = gpt_state_dict_to_hf({n: p.grad for n, p in plain.named_parameters()})
    g1 = gpt_state_dict_to_hf({n: p.grad for n, p in padded.named_parameters()}, cfg=replace(PAD, fused_qkv=fused))
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], **TOL, msg=lambda m: f"{n}: {m}")
    projections = ["qkv_proj"] if fused else ["q_proj", "k_proj", "v_proj"]
    for block in padded.h.values():  # every pad gradient exactly zero, so AdamW leaves the pads at zero
        for name in projections:
            p = getattr(block.attn, name)
            assert (p.weight.grad.view(-1, 16, 40)[:, 10:] == 0).all() and (p.bias.grad.view(-1, 16)[:, 10:] == 0).all()
        assert (block.attn.o_proj.weight.grad.view(40, 4, 16)[..., 10:] == 0).all()


def _trained(plan, steps=3):
    engine = GPTEngine(plan, DistInfo())
    gen = torch.Generator().manual_seed(1)
    losses = [engine.train_step(torch.randint(500, (plan.global_batch, plan.seq), generator=gen)) for _ in range(steps)]
    return losses, engine


@pytest.mark.parametrize("fused", [False, True], ids=["qkv-apart", "fused-qkv"])
def test_padded_plan_trains_like_the_plain_plan_with_adamw_accumulation_and_decay(fused):
    """Three AdamW steps (weight decay on) with 2 micro-steps each: the plain layout's losses (1e-6) and
    weights, the pad columns still exactly zero (AdamW's m, v and decay keep them), and then the plain
    layout's gradients to 1e-6."""
    common = dict(strategy="accum", global_batch=4, micro_batch=2, seq_len=16, fused_qkv=fused, weight_decay=0.1)
    plain = make_plan(ODD, **common, attention="plain")
    padded = make_plan(ODD, **common, attention="pad16")
    assert (plain.model.head_dim_padded, padded.model.head_dim_padded) == (0, 16)
    assert padded.describe()["attention_layout"] == "pad16" and padded.attention.head_dim == 16
    base_losses, base = _trained(plain)
    losses, engine = _trained(padded)
    assert losses == pytest.approx(base_losses, rel=1e-6)
    a, b = engine.full_state_dict(), base.full_state_dict()
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}  # checkpoints: unpadded
    for n in b:
        # AdamW's m/sqrt(v) turns a rounding-level gradient difference into a visible one where a gradient
        # is near zero (a key bias gets none in exact math: softmax is shift-invariant per query): the
        # weights agree to AdamW's amplification of float reordering; the gradients, below, to 1e-6.
        tol = dict(rtol=0, atol=3 * padded.lr) if n.endswith("k_proj.bias") else dict(rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(a[n], b[n], **tol, msg=lambda m: f"{n}: {m}")
    pads = _pad_columns(engine.core_model)
    assert pads and all((t == 0).all() for t in pads)
    # the gradients after those steps, at the same (the plain run's) weights: 1e-6
    engine.core_model.load_state_dict(pad_heads_state_dict(b, padded.model), strict=False)
    tokens = torch.randint(500, (2, 16), generator=torch.Generator().manual_seed(7))
    for e in (engine, base):
        e.optimizer.zero_grad(set_to_none=True)
        e.step.forward_backward_step(tokens, last=True)
    g1 = strip_heads_state_dict({n: p.grad for n, p in engine.core_model.named_parameters()}, padded.model)
    g0 = {n: p.grad for n, p in base.core_model.named_parameters()}
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], **TOL, msg=lambda m: f"{n}: {m}")
    states = [s for s in engine.optimizer.state.values()]
    assert states and all(torch.isfinite(s["exp_avg"]).all() for s in states)


def _padded_under(info, cases):
    out = {}
    for name, strategy in cases:
        plan = make_plan(
            ODD,
            strategy,
            world=info.world_size,
            global_batch=4,
            micro_batch=1,
            seq_len=16,
            attention="pad16",
            fused_qkv=True,
        )
        engine = GPTEngine(plan, info)
        gen = torch.Generator().manual_seed(1)
        losses = [engine.train_step(torch.randint(500, (4, 16), generator=gen)) for _ in range(2)]
        out[name] = (losses, engine.full_state_dict())
    return out


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_padded_heads_under_ddp_and_zero3_train_like_the_plain_single_process():
    """2 gloo ranks, 2 micro-steps each, AdamW: the padded layout sharded (zero3) or replicated (ddp) against
    the plain layout in one process."""
    from trainlab.distributed.spawn import spawn_for_test

    results = spawn_for_test(_padded_under, 2, [("ddp", "ddp"), ("zero3", "zero3")], timeout_s=240)[0]
    plain = make_plan(ODD, "none", global_batch=4, micro_batch=4, seq_len=16, attention="plain")
    ref_losses, engine = _trained(plain, steps=2)
    ref = engine.full_state_dict()
    for name in ("ddp", "zero3"):
        losses, sd = results[name]
        assert losses == pytest.approx(ref_losses, rel=1e-5), name
        got = gpt_state_dict_to_hf(sd)
        want = gpt_state_dict_to_hf(ref)
        for k in want:  # AdamW's first steps ≈ lr·sign(g): a reordered sum may flip a tiny gradient's sign
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} {k}: {m}")


def test_padded_heads_against_hf_both_ways():
    from transformers import GPT2LMHeadModel

    from trainlab.gpt.model import hf_config

    cfg = replace(PAD, fused_qkv=True, vocab_multiple=64)
    ours = build_gpt(cfg, seed=3).eval()
    hf = GPT2LMHeadModel(hf_config(ODD)).eval()
    hf.load_state_dict(gpt_state_dict_to_hf(ours.state_dict(), cfg=cfg), strict=True)  # HF holds no pads
    with torch.no_grad():
        torch.testing.assert_close(ours(TOKENS)[..., :500], hf(input_ids=TOKENS, use_cache=False).logits, **TOL)
    back = build_gpt(cfg, seed=9)
    back.load_state_dict(gpt_state_dict_from_hf(hf.state_dict(), cfg), strict=True)  # padded on load
    assert all((t == 0).all() for t in _pad_columns(back))
    with torch.no_grad():
        torch.testing.assert_close(back(TOKENS), ours(TOKENS), rtol=0, atol=0)
    assert strip_heads_state_dict(ours.state_dict(), cfg)["h.0.attn.o_proj.weight"].shape == (40, 40)


# ---------------------------------------------------------------------------------------------- the plan


def test_auto_pads_to_56_on_a_gpu_under_amp_and_stays_plain_elsewhere():
    def layout(model="gpt2-1.6b", strategy="amp", machine=H100, device="cuda", **kw):
        return make_plan(model, strategy, device=device, machine=machine, global_batch=1, micro_batch=1, **kw).model

    assert layout().head_dim_padded == 56  # head_dim 50, issue 35's table
    assert layout(strategy="amp", fused_qkv=True).attention_layout == "pad56"
    assert layout(strategy="none").head_dim_padded == 0  # fp32: not what the table measured
    assert layout(device="cpu", machine=Machine()).head_dim_padded == 0  # the CPU's flash takes any width
    assert layout(model="gpt2").head_dim_padded == 0  # head_dim 64 is a multiple of 8 already
    assert layout(impl="hf").head_dim_padded == 0  # HF's model has its own layout
    assert layout(machine=replace(H100, sm=75), strategy="fp16").head_dim_padded == 0  # not measured below sm80
    assert layout(attention="plain").head_dim_padded == 0
    assert layout(attention="pad64").head_dim_padded == 64
    p = make_plan("gpt2-1.6b", "amp", device="cuda", machine=H100, global_batch=1, micro_batch=1)
    assert p.attention.backend == "cudnn" and p.attention.head_dim == 56  # SDPA gets heads it hands to cuDNN
    assert GPTPlan.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(attention="pad12"), "--attention 'pad12': expected auto, plain or padN"),
        (dict(attention="wide"), "--attention 'wide': expected auto, plain or padN"),
        (dict(attention="pad8"), "--attention pad8: narrower than the model's head_dim 10"),
        (dict(attention="pad16", impl="hf"), "--attention pad16: a lever of our model, not of --impl hf"),
    ],
)
def test_bad_attention_layouts_are_one_line(kw, match):
    with pytest.raises(ConfigError, match=match):
        make_plan(ODD, global_batch=2, micro_batch=2, **kw)


def test_padded_heads_are_refused_with_tp():
    with pytest.raises(ConfigError, match="--attention pad24: not with tp"):
        make_plan("tiny", "tp", world=2, attention="pad24", global_batch=2, micro_batch=2)


# ---------------------------------------------------------------------------------------------- the planner


def test_planner_counts_the_padded_projections_and_heads():
    big = get_preset("gpt2-1.6b")
    plain = predict_memory(big, "amp", micro_batch=8, optimizer="fused", attention=None)
    padded = predict_memory(replace(big, head_dim_padded=56), "amp", micro_batch=8, optimizer="fused")
    extra_params = 48 * (3 * 32 * 6 * 1600 + 3 * 32 * 6 + 1600 * 32 * 6)  # 6 pad columns per head
    assert padded["params_bytes"] - plain["params_bytes"] == 4 * extra_params
    assert padded["attention"]["backend"] == "cudnn" and plain["attention"]["backend"] == "flash"
    # q, k, v and the output 56 wide instead of flash's padded copies plus a compact output
    assert padded["activations_bytes"] != plain["activations_bytes"]


@pytest.mark.parametrize("strategy", ["none", "amp"])
def test_padded_prediction_matches_the_measured_cpu_peak(strategy):
    """Live tensor bytes on the CPU (exact), as test_gpt_levers does for the other levers; tiny, seq 64."""
    from trainlab.gpt.planner import measure_step_peak_bytes

    plan = make_plan("tiny", strategy, global_batch=8, micro_batch=8, seq_len=64, attention="pad24", fused_qkv=True)
    tokens = torch.randint(512, (8, 64), generator=torch.Generator().manual_seed(0))
    measured = measure_step_peak_bytes(GPTEngine(plan, DistInfo()), tokens)
    predicted = predict_plan(plan)["total_bytes"]
    assert abs(predicted / measured - 1) < 0.12, (predicted, measured)


# ---------------------------------------------------------------------------------------------- --micro-batch-auto


def _auto_on(memory_bytes: int, strategy: str = "amp+accum+compile"):
    from trainlab.gpt.config import GPTBenchConfig

    machine = replace(H100, memory_bytes=memory_bytes)
    return GPTBenchConfig(
        model="gpt2-1.6b",
        strategy=strategy,
        device="cuda",
        global_batch=16,
        micro_batch_auto=True,
        vocab_multiple=64,
        fused_qkv=True,
        loss="chunked",
        fused_optimizer=True,
    ).plan(machine)


def _gpu_memory_for(budget: int) -> int:
    """The GPU memory whose usable part (planner.usable_bytes) is `budget`."""
    from trainlab.gpt.planner import CONTEXT_RESERVE_BYTES, FRAGMENTATION_MARGIN

    return int(budget / (1 - FRAGMENTATION_MARGIN)) + CONTEXT_RESERVE_BYTES + 1


def test_auto_considers_no_accumulation_on_the_issues_gpu():
    """Issue 35: on a 141 GB H200 the lab's gpt_best (amp+accum+compile, global batch 16) took 8 × 2 because
    accum refused 16 × 1; now no accumulation is a candidate and, predicted fastest, chosen."""
    p = _auto_on(141 * 10**9)
    assert (p.micro_batch, p.micro_steps, p.strategy.text) == (16, 1, "amp+compile")
    assert p.model.attention_layout == "pad56" and p.micro_batch_auto
    assert p.predicted_step_ms < _auto_on(141 * 10**9, "amp+compile").predicted_step_ms + 1e-9


def test_auto_picks_the_fastest_predicted_plan_not_the_largest_micro_batch():
    """The choice is the planner's fastest fitting candidate: with the real estimate, the minimum over every
    candidate (micro-batch × layout × accumulation) resolved by hand; with an estimate that favours small
    micro-batches, the smallest, so the largest is not built in."""
    from trainlab.gpt.config import GPTBenchConfig
    from trainlab.gpt.plan import _candidates, resolve
    from trainlab.gpt.planner import predicted_peak, predicted_step_seconds, usable_bytes

    memory = 40 * 2**30
    cfg = GPTBenchConfig(
        model="gpt2-1.6b", strategy="amp+accum", device="cuda", global_batch=16, micro_batch_auto=True, loss="chunked"
    )
    machine = replace(H100, memory_bytes=memory)
    kw = dict(predict=predicted_peak, usable=usable_bytes)
    chosen = resolve(cfg, machine, **kw, seconds=predicted_step_seconds)
    fits = []
    for run in _candidates(cfg, machine):
        try:
            p = resolve(run, machine, **kw, seconds=predicted_step_seconds)
        except ConfigError:
            continue
        if p.predicted_peak_bytes <= usable_bytes(memory):
            fits.append(p)
    assert len({(p.micro_batch, p.model.head_dim_padded) for p in fits}) >= 3
    assert chosen.predicted_step_ms == min(p.predicted_step_ms for p in fits)
    assert chosen.micro_batch == max(p.micro_batch for p in fits)  # here the fastest is also the largest
    slow_large = resolve(cfg, machine, **kw, seconds=lambda p: p.micro_batch)
    assert slow_large.micro_batch == 1 and slow_large.predicted_step_ms == 1000.0


# ---------------------------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_padded_heads_on_cuda_run_cudnn_and_match_the_plain_model_in_bf16():
    """head_dim 50 as GPT-2 1.6B's (8 heads of 50), bf16 autocast: cuDNN attention refuses the plain layout
    and takes the padded one; loss and gradients within bf16 of the plain model, pad gradients exactly 0."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = GPTConfig(vocab_size=2000, n_positions=256, n_embd=400, n_layer=2, n_head=8, fused_qkv=True)
    tokens = torch.randint(2000, (4, 256), generator=torch.Generator().manual_seed(0)).cuda()

    def run(c, backend=None):
        model = build_gpt(c, seed=0, device="cuda")
        only = sdpa_kernel([backend]) if backend else contextlib.nullcontext()
        with torch.autocast("cuda", dtype=torch.bfloat16), only:
            loss = lm_loss(model(tokens), tokens)
        loss.backward()
        return float(loss), model

    with pytest.raises(RuntimeError):
        run(cfg, SDPBackend.CUDNN_ATTENTION)  # head_dim 50: no cuDNN
    loss0, plain = run(cfg)
    padded_cfg = replace(cfg, head_dim_padded=56)
    loss1, padded = run(padded_cfg, SDPBackend.CUDNN_ATTENTION)
    assert loss1 == pytest.approx(loss0, rel=2e-3)
    g0 = gpt_state_dict_to_hf({n: p.grad.float().cpu() for n, p in plain.named_parameters()})
    g1 = gpt_state_dict_to_hf({n: p.grad.float().cpu() for n, p in padded.named_parameters()}, cfg=padded_cfg)
    for n in g0:
        err = (g1[n] - g0[n]).abs().max() / g0[n].abs().max().clamp_min(1e-12)
        assert err < 0.03 or n.endswith("c_attn.bias"), (n, float(err))  # the key third: ~0 in exact math
    for block in padded.h.values():
        assert (block.attn.qkv_proj.weight.grad.view(-1, 56, 400)[:, 50:] == 0).all()
        assert (block.attn.o_proj.weight.grad.view(400, 8, 56)[..., 50:] == 0).all()


@pytest.mark.gpu
def test_padded_plan_prediction_matches_the_cuda_allocator_peak():
    """The planner with the padded layout against torch.cuda.max_memory_allocated of the engine's step:
    GPT-2 1.6B's width and heads on 4 layers, bf16, seq 1024, micro-batch 4; 15 %."""
    model = replace(get_preset("gpt2-1.6b"), n_layer=4)
    plan = make_plan(
        model,
        "amp",
        device="cuda",
        global_batch=4,
        micro_batch=4,
        seq_len=1024,
        fused_qkv=True,
        loss="chunked",
        vocab_multiple=64,
        machine=Machine.detect(),
    )
    assert plan.model.head_dim_padded == 56
    tokens = torch.randint(50257, (4, 1024))
    engine = GPTEngine(plan, DistInfo(device=torch.device("cuda", 0)))
    engine.train_step(tokens)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    engine.train_step(tokens)
    torch.cuda.synchronize()
    predicted, measured = predict_plan(plan)["total_bytes"], torch.cuda.max_memory_allocated()
    assert abs(predicted / measured - 1) < 0.15, (predicted, measured)
