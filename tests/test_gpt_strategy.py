"""Strategy parsing, validation before launch, and the single-process engine (fast, no processes)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch
from gpt_plans import make_plan

from trainlab.distributed.launch import DistInfo, init_distributed, needs_launch
from trainlab.errors import ConfigError, HardwareError
from trainlab.gpt.engine import GPTEngine
from trainlab.gpt.model import initial_value
from trainlab.gpt.plan import Machine
from trainlab.gpt.shape import count_params, get_preset
from trainlab.gpt.strategy import STRATEGY_NAMES, Degrees, parse_strategy, resolve_degrees, validate_strategy

TINY = get_preset("tiny")  # 4 layers, 4 heads


def test_parse_canonical_and_fields():
    spec = parse_strategy("ckpt+amp+zero3")
    assert spec.text == "zero3+amp+ckpt"
    assert (spec.data_parallel, spec.amp, spec.ckpt, spec.uses_fsdp) == ("zero3", "bf16", "full", True)
    assert parse_strategy("fp16+ddp+accum").amp == "fp16"
    assert parse_strategy("ckpt-selective+zero2").ckpt == "selective"
    spec = parse_strategy("tp+pp")
    assert spec.tp and spec.pp and spec.data_parallel is None
    assert parse_strategy("offload").data_parallel == "zero3"  # offload implies full sharding
    assert parse_strategy("zero2+offload").data_parallel == "zero2"
    assert parse_strategy("none").distributed is False
    assert set(STRATEGY_NAMES) >= {
        "none",
        "ddp",
        "zero1",
        "zero2",
        "zero3",
        "tp",
        "pp",
        "amp",
        "bf16",
        "fp16",
        "accum",
        "ckpt",
        "ckpt-selective",
        "offload",
        "nvme",
        "compile",
    }


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "expected one or more"),
        ("dpp", "unknown name 'dpp'; valid: none, ddp"),
        ("ddp++amp", "empty name"),
        ("ddp+ddp", "given twice"),
        ("none+amp", "'none' means plain training"),
        ("ddp+zero3", "ddp and zero3 are alternative"),
        ("zero1+nvme", "zero1 and nvme are alternative"),
        ("bf16+fp16", "pick one precision"),
        ("ckpt+ckpt-selective", "pick one of ckpt"),
        ("ddp+offload", "combine it with zero2 or zero3"),
        ("zero1+tp", "ZeroRedundancyOptimizer cannot hold tp's DTensor parameters"),
        ("offload+tp", "offload shards over every rank; it does not combine with tp"),
        ("nvme+pp", "nvme shards over every rank; it does not combine with pp"),
        ("ddp+tp+fp16", "use bf16"),
        ("pp+fp16", "use bf16 with pp"),
        ("pp+accum", "drop accum"),
        ("nvme+compile", "compile is not supported"),
    ],
)
def test_parse_rejects(text, message):
    with pytest.raises(ConfigError, match=None) as err:
        parse_strategy(text)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_resolve_degrees():
    assert resolve_degrees(parse_strategy("ddp"), 4) == Degrees(dp=4, pp=1, tp=1)
    assert resolve_degrees(parse_strategy("tp"), 2) == Degrees(dp=1, pp=1, tp=2)
    assert resolve_degrees(parse_strategy("pp"), 4) == Degrees(dp=1, pp=4, tp=1)
    assert resolve_degrees(parse_strategy("tp+pp"), 4) == Degrees(dp=1, pp=2, tp=2)
    assert resolve_degrees(parse_strategy("tp+pp"), 8, tp=4) == Degrees(dp=1, pp=2, tp=4)
    assert resolve_degrees(parse_strategy("tp+pp"), 8, pp=4) == Degrees(dp=1, pp=4, tp=2)
    # a data-parallel strategy beside tp/pp: two replicas unless the degrees say otherwise
    assert resolve_degrees(parse_strategy("ddp+tp"), 4) == Degrees(dp=2, pp=1, tp=2)
    assert resolve_degrees(parse_strategy("zero3+pp"), 4) == Degrees(dp=2, pp=2, tp=1)
    assert resolve_degrees(parse_strategy("ddp+tp+pp"), 8) == Degrees(dp=2, pp=2, tp=2)
    assert resolve_degrees(parse_strategy("zero2+tp"), 8, tp=2) == Degrees(dp=4, pp=1, tp=2)
    assert resolve_degrees(parse_strategy("ddp+tp+pp"), 8, tp=2) == Degrees(dp=2, pp=2, tp=2)


def _validate(strategy, world=2, gb=8, mb=4, **kw):
    return validate_strategy(parse_strategy(strategy), TINY, world, gb, mb, **kw)


@pytest.mark.parametrize(
    "strategy, kw, message",
    [
        ("tp", dict(world=3, gb=6, mb=6), "--tp 3: must divide the number of heads (4)"),
        ("tp+pp", dict(world=6, tp=4), "--nproc 6: not divisible by tp×pp = 4×1"),
        ("pp", dict(world=8, gb=8, mb=1), "--pp 8: more pipeline stages than layers (4)"),
        ("pp", dict(world=1), "pp needs >= 2 stages"),
        ("tp", dict(world=1), "tp needs a degree >= 2"),
        ("ddp", dict(gb=8, mb=3), "--micro-batch 3: must divide the per-rank batch 4"),
        ("ddp", dict(world=3, gb=8, mb=1), "--global-batch 8: not divisible by the 3 data-parallel ranks"),
        ("ddp+accum", dict(gb=8, mb=4), "accum needs --micro-batch smaller than the per-rank batch 4"),
        ("none", dict(world=2), "is single-process"),
        ("bf16", dict(world=2), "is single-process"),
        ("pp", dict(gb=8, mb=2, microbatches=3), "--microbatches 3: must divide the per-rank batch 8"),
        ("ddp", dict(microbatches=2), "only used with pp"),
        ("pp", dict(world=4, gb=8, mb=4), "--microbatches 2: 1F1B needs at least as many micro-batches as stages (4)"),
        ("pp", dict(gb=8, mb=2, pp_schedule="zb"), "--pp-schedule 'zb': expected gpipe or 1f1b"),
        ("ddp", dict(tp=2), "--tp 2: the strategy 'ddp' has no tp"),
        (
            "ddp+tp+pp",
            dict(world=4, tp=2, pp=2),
            "no second data-parallel replica for ddp; use more ranks (e.g. --nproc 8)",
        ),
        ("ddp+tp+pp", dict(world=4), "tp needs a degree >= 2 (got --nproc 4, tp 1)"),
        ("zero3+tp", dict(world=4, tp=4), "tp 4 × pp 1 leave no second data-parallel replica"),
        ("tp", dict(impl="hf", gb=8, mb=8), "--impl hf"),
        ("ddp+ckpt-selective", dict(impl="hf"), "only for --impl ours"),
        ("ddp", dict(impl="jax"), "--impl 'jax': expected ours or hf"),
        ("ddp", dict(seq_len=65), "--seq 65: expected 2..64"),
        ("ddp", dict(gb=0), "expected positive integers"),
    ],
)
def test_validate_rejects_before_launch(strategy, kw, message):
    with pytest.raises(ConfigError) as err:
        _validate(strategy, **kw)
    assert message in str(err.value)


def test_validate_accepts_and_returns_degrees():
    assert _validate("zero3+amp+ckpt") == Degrees(dp=2, pp=1, tp=1)
    assert _validate("ddp+accum", mb=2) == Degrees(dp=2, pp=1, tp=1)
    assert _validate("pp", mb=2, microbatches=4) == Degrees(dp=1, pp=2, tp=1)
    assert _validate("pp", world=4, mb=4, pp_schedule="gpipe") == Degrees(dp=1, pp=4, tp=1)  # GPipe: any count
    assert _validate("zero3", world=1) == Degrees(dp=1, pp=1, tp=1)  # one GPU + FSDP (offload) is valid


def test_cuda_without_gpu_is_a_hardware_error():
    """The device is checked against the machine the plan is resolved on (described here, not detected)."""
    with pytest.raises(HardwareError, match="no CUDA GPU"):
        make_plan("tiny", "ddp", world=2, device="cuda", machine=Machine(), global_batch=8, micro_batch=4)
    with pytest.raises(HardwareError, match="--nproc 2: only 1 CUDA device"):
        make_plan("tiny", "ddp", world=2, device="auto", machine=Machine(gpus=1, sm=90), global_batch=8, micro_batch=4)
    with pytest.raises(ConfigError, match="--device 'tpu'"):
        make_plan("tiny", "none", device="tpu")
    assert make_plan("tiny", "none", device="auto", machine=Machine()).device == "cpu"
    assert make_plan("tiny", "none", device="auto", machine=Machine(gpus=1, sm=80)).device == "cuda"


def test_nvme_needs_deepspeed_and_gpu(monkeypatch):
    """Without deepspeed: one line naming the optional extra (compare's "not installed" row); with it but
    on a CPU: one line asking for a GPU."""
    from trainlab.gpt.parallel import nvme

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(
        nvme.NotInstalled, match=r"deepspeed is not installed \(the optional extra: pip install '.\[offload\]'\)"
    ):
        make_plan("tiny", "nvme", global_batch=2, micro_batch=2, seq_len=8)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "deepspeed" else real(name, *a)
    )
    with pytest.raises(HardwareError, match="--strategy nvme needs a CUDA GPU"):
        make_plan("tiny", "nvme", global_batch=2, micro_batch=2, seq_len=8, device="cpu")


def test_engine_rejects_bad_tokens_and_optimizer():
    engine = GPTEngine(make_plan("tiny", "none", global_batch=2, micro_batch=2, seq_len=8), DistInfo())
    with pytest.raises(ConfigError, match=r"expected tokens of shape \(2, 8\)"):
        engine.train_step(torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(ConfigError, match="--optimizer 'lion'"):
        make_plan("tiny", "none", global_batch=2, micro_batch=2, seq_len=8, optimizer="lion")


def test_same_seed_same_initial_weights():
    a = GPTEngine(
        make_plan("tiny", "none", seed=3, global_batch=2, micro_batch=2, seq_len=8), DistInfo()
    ).full_state_dict()
    b = GPTEngine(
        make_plan("tiny", "ckpt+bf16", seed=3, global_batch=2, micro_batch=1, seq_len=8), DistInfo()
    ).full_state_dict()
    c = GPTEngine(
        make_plan("tiny", "none", seed=4, global_batch=2, micro_batch=2, seq_len=8), DistInfo()
    ).full_state_dict()
    for k, v in a.items():
        assert torch.equal(v, b[k]) and torch.equal(v, initial_value(TINY, k, 3)), k
    assert not torch.equal(a["h.0.mlp.fc.weight"], c["h.0.mlp.fc.weight"])
    assert torch.equal(a["lm_head.weight"], a["wte.weight"])


def test_single_process_accumulation_and_checkpointing_match_plain():
    """Micro-batches of 2 with accumulation, and recomputation, give plain training's losses."""
    toks = torch.randint(0, TINY.vocab_size, (2, 4, 16), generator=torch.Generator().manual_seed(0))
    runs = {}
    for strategy, mb in [("none", 4), ("accum", 2), ("ckpt", 4), ("ckpt-selective", 4)]:
        e = GPTEngine(
            make_plan("tiny", strategy, seed=1, global_batch=4, micro_batch=mb, seq_len=16, optimizer="sgd", lr=0.5),
            DistInfo(),
        )
        runs[strategy] = ([e.train_step(x) for x in toks], e.full_state_dict())
    ref_losses, ref_sd = runs.pop("none")
    assert ref_losses[1] != ref_losses[0]
    for name, (losses, sd) in runs.items():
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0, msg=name)
        for k in ref_sd:
            torch.testing.assert_close(sd[k], ref_sd[k], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name} {k}: {m}")


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_hf_impl_trains_like_ours():
    """`--impl hf` (HF GPT2LMHeadModel, the handout's baseline) starts from our weights and follows
    the same trajectory: same function, different kernels (Conv1D addmm vs Linear), so 1e-5."""
    toks = torch.randint(0, TINY.vocab_size, (2, 2, 16), generator=torch.Generator().manual_seed(0))
    runs = {}
    for impl in ("ours", "hf"):
        e = GPTEngine(
            make_plan(
                "tiny", "none", seed=1, global_batch=2, micro_batch=2, seq_len=16, impl=impl, optimizer="sgd", lr=0.5
            ),
            DistInfo(),
        )
        runs[impl] = ([e.train_step(x) for x in toks], e.full_state_dict())
    torch.testing.assert_close(torch.tensor(runs["hf"][0]), torch.tensor(runs["ours"][0]), rtol=1e-5, atol=0)
    assert set(runs["hf"][1]) == set(runs["ours"][1])
    for k, v in runs["ours"][1].items():
        torch.testing.assert_close(runs["hf"][1][k], v, rtol=1e-4, atol=1e-5, msg=lambda m: f"{k}: {m}")


def test_init_distributed_without_torchrun_is_world_of_one(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    info = init_distributed(device="cpu")
    assert (info.rank, info.world_size, info.device.type) == (0, 1, "cpu")
    assert not torch.distributed.is_initialized()
    assert not needs_launch(1)


@pytest.mark.gpu
def test_compile_matches_eager_on_gpu():
    """torch.compile of each block (CPU inductor takes minutes on 2 cores, so GPU only)."""
    toks = torch.randint(0, TINY.vocab_size, (2, 4, 32), generator=torch.Generator().manual_seed(0))
    info = DistInfo(device=torch.device("cuda"))
    runs = {}
    for strategy in ("none", "compile"):
        e = GPTEngine(
            make_plan("tiny", strategy, device="cuda", seed=1, global_batch=4, micro_batch=4, seq_len=32), info
        )
        runs[strategy] = [e.train_step(x) for x in toks]
    torch.testing.assert_close(torch.tensor(runs["compile"]), torch.tensor(runs["none"]), rtol=1e-4, atol=0)


def test_fsdp_offload_and_ddp_in_one_process_match_plain():
    """zero3/offload/ddp with --nproc 1 (e.g. CPU offload on one GPU) create a one-rank process
    group themselves and train exactly like plain training."""
    from trainlab.distributed.launch import release_group

    toks = torch.randint(0, TINY.vocab_size, (2, 4, 16), generator=torch.Generator().manual_seed(0))
    try:
        runs = {}
        for strategy in ("none", "offload", "zero2+accum", "ddp"):
            mb = 2 if "accum" in strategy else 4
            e = GPTEngine(
                make_plan(
                    "tiny", strategy, seed=1, global_batch=4, micro_batch=mb, seq_len=16, optimizer="sgd", lr=0.5
                ),
                DistInfo(),
            )
            runs[strategy] = ([e.train_step(x) for x in toks], e.full_state_dict())
            assert e.local_parameter_bytes() == 4 * count_params(TINY)  # one rank holds everything
            assert e.describe()["micro_steps"] == (2 if "accum" in strategy else 1)
        assert torch.distributed.is_initialized() and torch.distributed.get_world_size() == 1
    finally:
        release_group()
    ref_losses, ref_sd = runs.pop("none")
    for name, (losses, sd) in runs.items():
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=0, msg=name)
        for k in ref_sd:
            torch.testing.assert_close(sd[k], ref_sd[k], rtol=1e-5, atol=1e-6, msg=lambda m: f"{name} {k}: {m}")


def test_matmul_precision_is_resolved_in_the_plan_and_applied_by_bench():
    """--matmul-precision (torch.set_float32_matmul_precision) beside --tf32: on = high; the plan holds
    the resolved value (it round-trips through the worker spec) and the bench applies and records it."""
    from trainlab.gpt.bench import run_bench
    from trainlab.gpt.plan import GPTPlan

    assert make_plan("tiny", "none").matmul_precision == "highest"
    assert make_plan("tiny", "none", tf32="on").matmul_precision == "high"
    plan = make_plan("tiny", "none", matmul_precision="medium", steps=1, warmup=0, global_batch=2, micro_batch=2)
    assert plan.matmul_precision == "medium" and GPTPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(ConfigError, match="--matmul-precision highest: conflicts with --tf32 on"):
        make_plan("tiny", "none", tf32="on", matmul_precision="highest")
    before = torch.get_float32_matmul_precision()
    try:
        summary = run_bench(replace(plan, seq=16), log=lambda *a: None)
        assert summary["tf32"]["float32_matmul_precision"] == "medium"
    finally:
        torch.set_float32_matmul_precision(before)
