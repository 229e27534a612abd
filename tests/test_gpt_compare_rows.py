"""`gpt compare`'s rows: the dp × tp × pp mesh rows it offers, its --budget, the "not installed" row of an
optional backend, and the loss difference to single-process training (no process is started here)."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest

from trainlab.errors import UserError
from trainlab.gpt import compare
from trainlab.gpt.compare import _check_same_start, default_matrix, run_compare, run_one
from trainlab.gpt.config import CompareConfig, GPTBenchConfig, plan_for_strategy
from trainlab.gpt.plan import Machine
from trainlab.gpt.shape import get_preset
from trainlab.gpt.strategy import mesh_rows

TINY = dict(model="tiny", device="cpu", seq=16, global_batch=8)


def test_mesh_rows_where_they_fit():
    assert mesh_rows(2) == [] and mesh_rows(6) == ["ddp+tp", "zero3+tp", "ddp+pp", "zero2+pp"]
    assert mesh_rows(8)[-2:] == ["ddp+tp+pp", "zero3+tp+pp"]
    # a model whose 25 heads no even tp degree divides keeps only the pipeline rows
    odd = get_preset("tiny").__class__(vocab_size=512, n_positions=64, n_embd=100, n_layer=4, n_head=25)
    assert mesh_rows(8, odd) == ["ddp+pp", "zero2+pp"]
    assert set(mesh_rows(8)) <= set(default_matrix(8)) and not set(mesh_rows(8)) & set(default_matrix(2))


@pytest.mark.parametrize(
    "strategy, degrees, micro, micro_steps",
    [
        ("ddp+tp+pp", (2, 2, 2), 2, 2),  # per replica 4 sequences; 1F1B needs >= 2 micro-batches for 2 stages
        ("zero3+tp", (2, 1, 4), 4, 1),
        ("zero2+pp", (2, 4, 1), 1, 4),
        ("tp+pp", (1, 2, 4), 4, 2),
    ],
)
def test_compare_sizes_every_mesh_row_to_a_valid_plan(strategy, degrees, micro, micro_steps):
    plan = plan_for_strategy(GPTBenchConfig(nproc=8, **TINY), strategy).plan(Machine())
    assert (plan.degrees.dp, plan.degrees.pp, plan.degrees.tp) == degrees
    assert (plan.micro_batch, plan.micro_steps, plan.global_batch) == (micro, micro_steps, 8)


def test_budget_cuts_timeouts_and_skips_what_it_leaves_no_time_for(tmp_path, monkeypatch):
    clock, timeouts = [0.0], []

    def fake_run_one(cfg, out, slug, machine, timeout_s):
        timeouts.append((cfg.strategy, timeout_s))
        clock[0] += 50.0  # each row takes 50 s
        return {"strategy": cfg.strategy, "nproc": 1, "micro_batch": 8, "status": "failed", "error": "x"}

    monkeypatch.setattr(compare, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(compare, "run_one", fake_run_one)
    cc = CompareConfig(
        bench=GPTBenchConfig(**TINY), strategies="none,amp,ckpt", timeout_s=60, budget_s=100, out=str(tmp_path / "c")
    )
    with pytest.raises(UserError, match="nothing was measured"):  # every row failed: exit 2, the table kept
        run_compare(cc, log=lambda *a: None)
    rows = json.loads((tmp_path / "c" / "compare.json").read_text())["rows"]
    assert timeouts == [("none", 60), ("amp", 50)]
    assert rows[2]["status"] == "skipped" and "--budget of 100 s was spent" in rows[2]["error"]


def test_nvme_without_deepspeed_is_a_not_installed_row(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    row = run_one(plan_for_strategy(GPTBenchConfig(**TINY), "amp+nvme"), str(tmp_path), "nvme", Machine(), 10)
    assert row["status"] == "not installed"
    assert row["error"] == "--strategy nvme: deepspeed is not installed (the optional extra: pip install '.[offload]')"


def test_loss_difference_to_single_process():
    ok = dict(status="ok", first_loss=6.0)
    rows = [
        {**ok, "strategy": "none", "losses": [6.0, 5.9, 5.8]},
        {**ok, "strategy": "ddp+tp+pp", "losses": [6.0, 5.9000002, 5.7999]},
        {"strategy": "pp", "status": "invalid"},
    ]
    _check_same_start(rows)
    assert rows[1]["loss_max_diff_vs_none"] == pytest.approx(1e-4, rel=1e-3)
    assert "loss_max_diff_vs_none" not in rows[2]


def test_compare_table_states_the_uniform_token_loss_floor():
    from trainlab.gpt.compare import header_md

    assert "no loss goes below ln V = ln 50257 = 10.82" in header_md(CompareConfig(bench=GPTBenchConfig()))


def test_deepspeed_config_sizes_agree_with_the_plan():
    """The NVMe path's config (built without deepspeed): DeepSpeed checks train = micro × accumulation × world."""
    from trainlab.gpt.parallel.nvme import deepspeed_config

    cfg = deepspeed_config(micro_batch=2, accumulation_steps=4, world_size=2, lr=1e-3, amp="bf16", nvme_path="/x")
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (
        16,
        2,
        4,
    )
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == zero["offload_optimizer"]["device"] == "nvme"
    assert cfg["bf16"]["enabled"] and not cfg["fp16"]["enabled"] and zero["offload_param"]["nvme_path"] == "/x"


def test_planner_predicts_the_mesh_rows():
    """dp2×pp2×tp2 of GPT-2 1.6B: each rank computes with the same stage piece under ddp and zero3;
    zero3 holds half of it (and of its optimizer states), ddp all of it plus the gradient buffer."""
    from trainlab.gpt.planner import predict_memory

    cfg = get_preset("gpt2-1.6b")
    ddp, zero3 = (predict_memory(cfg, s, 8, 2, 1024, microbatches=2) for s in ("ddp+tp+pp", "zero3+tp+pp"))
    tp_pp = predict_memory(cfg, "tp+pp", 4, 2, 1024, microbatches=2)  # the same pieces, one replica
    assert ddp["params_bytes"] == tp_pp["params_bytes"] and ddp["optimizer_bytes"] == tp_pp["optimizer_bytes"]
    assert zero3["optimizer_bytes"] == pytest.approx(ddp["optimizer_bytes"] / 2)
    assert zero3["total_bytes"] < ddp["total_bytes"] < tp_pp["total_bytes"] + ddp["buffers_bytes"] + 1
