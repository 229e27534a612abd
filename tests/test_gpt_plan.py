"""The GPT plan: resolved once (no 'auto'), round-trips through the worker spec, one prediction."""

from __future__ import annotations

import json

import pytest

from trainlab.errors import ConfigError
from trainlab.gpt.compare import default_matrix
from trainlab.gpt.config import GPTBenchConfig
from trainlab.gpt.plan import GPTPlan, Machine
from trainlab.gpt.planner import default_strategies, predict_memory, predicted_peak

GIB = 1024**3
H100 = Machine(gpus=2, sm=90, cudnn_version=92000)
STRATEGIES = sorted(set(default_strategies(1) + default_strategies(2) + default_matrix(1) + default_matrix(2)))


def _bench(strategy: str, device: str, **kw) -> GPTBenchConfig:
    """A 2-GPU-sized run of `strategy` (single-device strategies on one process)."""
    from trainlab.gpt.strategy import parse_strategy

    spec = parse_strategy(strategy)
    nproc = 2 if spec.distributed else 1
    micro = 2 if spec.accum or spec.pp else 4
    return GPTBenchConfig(
        model="gpt2-1.6b", strategy=strategy, nproc=nproc, device=device, global_batch=8, micro_batch=micro, **kw
    )


def test_issue_28_device_auto_and_cuda_predict_the_same():
    """Before the plan, `planner.predicted_bytes` gave 25.19 GiB for `--device auto` (it took 'auto' for a CPU:
    the loop optimizer, no foreach temporary) and 29.01 GiB for `--device cuda`, which the in-run prediction used
    (the plain head layout, as then)."""
    auto = GPTBenchConfig(strategy="amp+ckpt", micro_batch=8, device="auto", attention="plain").plan(H100)
    cuda = GPTBenchConfig(strategy="amp+ckpt", micro_batch=8, device="cuda", attention="plain").plan(H100)
    assert auto == cuda and auto.device == "cuda" and auto.optimizer_kernel == "foreach"
    assert auto.predicted_peak_bytes / GIB == pytest.approx(29.0128, abs=1e-3)


@pytest.mark.parametrize("device", ["auto", "cuda"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_preflight_and_in_run_predictions_are_equal(strategy, device):
    """The parent's out-of-memory check reads `plan.predicted_peak_bytes`; the worker gets the plan as JSON and its
    summary reports the same field. Both equal the planner's one translation of the plan, recomputed in the worker."""
    parent = _bench(strategy, device).plan(H100)
    worker = GPTPlan.from_dict(json.loads(json.dumps(parent.to_dict())), source="spec")
    assert worker == parent
    assert worker.predicted_peak_bytes == parent.predicted_peak_bytes == predicted_peak(worker)
    assert parent.predicted_peak_bytes == _bench(strategy, "cuda").plan(H100).predicted_peak_bytes
    assert parent.predicted_peak_bytes is not None and parent.predicted_peak_bytes > 0


def test_plan_resolves_every_setting():
    p = GPTBenchConfig(
        model="tiny", strategy="bf16+accum+ckpt", global_batch=8, micro_batch=2, seq=32, fused_optimizer=True
    ).plan(Machine(gpus=1, sm=80))
    assert (p.device, p.sm, p.amp, p.checkpointing, p.offload) == ("cuda", 80, "bf16", "full", False)
    assert (p.per_rank_batch, p.micro_batch, p.micro_steps, p.seq) == (8, 2, 4, 32)
    assert p.optimizer_kernel == "fused" and p.attention.backend == "flash"
    assert p.strategy.text == "bf16+accum+ckpt" and p.model.n_layer == 4
    # a pipeline's micro-batch is the per-rank batch over its micro-batches, whatever --micro-batch said
    pp = GPTBenchConfig(
        model="tiny", strategy="pp", nproc=2, device="cpu", global_batch=8, micro_batch=2, microbatches=2
    ).plan(Machine())
    assert (pp.degrees.pp, pp.micro_steps, pp.micro_batch) == (2, 2, 4)
    assert (
        pp.predicted_peak_bytes
        == predict_memory(pp.model, "pp", 2, 4, 64, microbatches=2, device_type="cpu", optimizer="forloop")[
            "total_bytes"
        ]
    )
    # tp mixes DTensors and plain tensors: the per-parameter loop, whatever was asked
    tp = GPTBenchConfig(model="tiny", strategy="tp", nproc=2, global_batch=8, micro_batch=8, fused_optimizer=True).plan(
        H100
    )
    assert tp.optimizer_kernel == "forloop"


def test_unmodelled_runs_have_no_prediction():
    hf = GPTBenchConfig(model="tiny", impl="hf", strategy="ckpt", device="cpu", global_batch=4, micro_batch=4).plan(
        Machine()
    )
    assert hf.predicted_peak_bytes is None


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: d.update(bogus=1), "unknown plan keys: bogus"),
        (lambda d: d["model"].update(n_heads=3), "not a plan trainlab wrote"),
        (lambda d: d.update(optimizer="lion"), "--optimizer 'lion'"),
        (lambda d: d.update(device="tpu"), "--device 'tpu'"),
        (lambda d: d.update(loss="focal"), "--loss 'focal'"),
    ],
)
def test_damaged_spec_is_one_error(damage, message):
    d = GPTBenchConfig(model="tiny", device="cpu", global_batch=4, micro_batch=4).plan(Machine()).to_dict()
    damage(d)
    with pytest.raises(ConfigError, match=message):
        GPTPlan.from_dict(d, source="x.spec.json")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        GPTPlan.from_dict([1], source="x.spec.json")


def test_a_loss_is_a_plan_field_and_a_table_entry(monkeypatch):
    """The step seam: a new loss is one name in `plan.LOSSES` and its function in `step.LOSS_FUNCTIONS`; the
    engine, its micro-steps and the pipeline use it with no other change (here: twice the cross-entropy doubles
    the reported loss)."""
    from dataclasses import replace

    import torch

    from trainlab.distributed.launch import DistInfo
    from trainlab.gpt import plan as plan_module
    from trainlab.gpt import step as step_module
    from trainlab.gpt.engine import GPTEngine
    from trainlab.gpt.model import lm_loss

    monkeypatch.setattr(plan_module, "LOSSES", (*plan_module.LOSSES, "double"))
    monkeypatch.setitem(step_module.LOSS_FUNCTIONS, "double", lambda logits, tokens: 2 * lm_loss(logits, tokens))
    base = GPTBenchConfig(model="tiny", strategy="accum", device="cpu", global_batch=4, micro_batch=2, seq=16).plan(
        Machine()
    )
    tokens = torch.randint(512, (4, 16), generator=torch.Generator().manual_seed(0))
    plain = GPTEngine(base, DistInfo()).train_step(tokens)
    doubled = GPTEngine(replace(base, loss="double"), DistInfo()).train_step(tokens)
    assert doubled == pytest.approx(2 * plain, rel=1e-6)
