"""Model parallelism on a device mesh equals single-process training: tp+pp on 2×2, data parallelism
beside tp or pp on 4 ranks (dp2×tp2, dp2×pp2), and dp2×pp2×tp2 on 8 ranks.

Separate from test_gpt_parallel.py because 4 processes on a 2-core machine take ~1 minute (8 take
~3); the cases and tolerances are those of test_gpt_parallel.py (see its docstring). Each data-
parallel kind meets each model-parallel kind once (ddp and zero3 with tp; ddp, zero1 and zero2 with
pp), with SGD (strict: a gradient averaged over the wrong group moves parameters by ~lr·|g|) or
AdamW (the real optimizer).
"""

from __future__ import annotations

import pytest
import torch
from test_gpt_parallel import _assert_params_match, reference, run_cases

from trainlab.distributed.spawn import spawn_for_test

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(420)]


def _assert_equal_to_reference(results, name, optimizer):
    ref_losses, ref_state = reference(optimizer)
    runs = [r[(name, optimizer)] for r in results]
    assert all(r["losses"] == runs[0]["losses"] for r in runs)  # every rank reports the same loss
    assert all(r["state"] is None for r in runs[1:])
    torch.testing.assert_close(torch.tensor(runs[0]["losses"]), torch.tensor(ref_losses), rtol=1e-5, atol=0)
    _assert_params_match(runs[0]["state"], ref_state, optimizer)


def test_tp_pp_2x2_matches_single_process():
    cases = [
        ("tp+pp", "sgd", dict(strategy="tp+pp", micro_batch=2, pp_schedule="1f1b")),
        ("tp+pp", "adamw", dict(strategy="tp+pp", micro_batch=2, pp_schedule="gpipe")),
    ]
    results = spawn_for_test(run_cases, 4, cases, timeout_s=400)
    for optimizer in ("sgd", "adamw"):
        _assert_equal_to_reference(results, "tp+pp", optimizer)


DP_BESIDE_MODEL_PARALLEL = [  # 4 ranks: dp2 × (tp2 | pp2); global batch 8 → 4 per replica
    ("ddp+tp", "sgd", dict(strategy="ddp+tp", micro_batch=2)),  # 2 micro-steps: one sync per step
    ("zero3+tp", "adamw", dict(strategy="zero3+tp", micro_batch=4)),  # FSDP2 × DTensor (2-D)
    ("ddp+pp", "sgd", dict(strategy="ddp+pp", micro_batch=2, pp_schedule="1f1b")),
    ("zero1+pp", "adamw", dict(strategy="zero1+pp", micro_batch=2, pp_schedule="gpipe")),
    ("zero2+pp", "sgd", dict(strategy="zero2+pp", micro_batch=2, pp_schedule="1f1b")),
]


@pytest.fixture(scope="module")
def dp_beside_mp():
    return spawn_for_test(run_cases, 4, DP_BESIDE_MODEL_PARALLEL, timeout_s=400)


@pytest.mark.parametrize("name, optimizer", [(n, o) for n, o, _ in DP_BESIDE_MODEL_PARALLEL])
def test_dp2_with_tp2_or_pp2_matches_single_process(dp_beside_mp, name, optimizer):
    _assert_equal_to_reference(dp_beside_mp, name, optimizer)


@pytest.mark.timeout(600)
def test_dp2_pp2_tp2_on_8_ranks_matches_single_process():
    """The 3-D mesh: 2 replicas × 2 stages × 2 tensor-parallel ranks. ddp replicates each rank's
    piece; zero3 shards it again over dp, so its ranks hold half the bytes (not a silent fallback)."""
    cases = [
        ("ddp+tp+pp", "sgd", dict(strategy="ddp+tp+pp", micro_batch=2, pp_schedule="1f1b")),
        ("zero3+tp+pp", "adamw", dict(strategy="zero3+tp+pp", micro_batch=2, pp_schedule="gpipe")),
    ]
    results = spawn_for_test(run_cases, 8, cases, timeout_s=560)
    _assert_equal_to_reference(results, "ddp+tp+pp", "sgd")
    _assert_equal_to_reference(results, "zero3+tp+pp", "adamw")
    replicated = [r[("ddp+tp+pp", "sgd")]["param_bytes"] for r in results]
    sharded = [r[("zero3+tp+pp", "adamw")]["param_bytes"] for r in results]
    assert replicated[:4] == replicated[4:]  # the two replicas (ranks 0-3, 4-7) hold the same pieces
    assert sum(sharded) * 2 == sum(replicated)
