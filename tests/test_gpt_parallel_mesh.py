"""tp+pp on a 2×2 device mesh (4 processes): equals single-process training.

Separate from test_gpt_parallel.py because 4 processes on a 2-core machine take ~1 minute; the
cases and tolerances are those of test_gpt_parallel.py (see its docstring).
"""

from __future__ import annotations

import pytest
import torch
from test_gpt_parallel import _assert_params_match, reference, run_cases

from trainlab.distributed.spawn import spawn_for_test

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(420)]


def test_tp_pp_2x2_matches_single_process():
    cases = [
        ("tp+pp", "sgd", dict(strategy="tp+pp", micro_batch=2, pp_schedule="1f1b")),
        ("tp+pp", "adamw", dict(strategy="tp+pp", micro_batch=2, pp_schedule="gpipe")),
    ]
    results = spawn_for_test(run_cases, 4, cases, timeout_s=400)
    for optimizer in ("sgd", "adamw"):
        ref_losses, ref_state = reference(optimizer)
        runs = [r[("tp+pp", optimizer)] for r in results]
        assert all(r["losses"] == runs[0]["losses"] for r in runs)  # all 4 ranks report the same loss
        assert all(r["state"] is None for r in runs[1:])
        torch.testing.assert_close(torch.tensor(runs[0]["losses"]), torch.tensor(ref_losses), rtol=1e-5, atol=0)
        _assert_params_match(runs[0]["state"], ref_state, optimizer)
