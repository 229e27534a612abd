"""The shared check harness: one row schema for every operator, and every tensor it hands to autograd
on the rung's device (the GPU-only conv_relu_pool2d bug of issue 29, caught here without a GPU)."""

import dataclasses

import pytest
import torch

from trainlab.cli import main
from trainlab.ops import check, registry


def test_gelu_and_conv2d_rows_have_the_same_schema(capsys):
    """`ops check --op gelu` and `--op conv2d`: every row (case table and autograd table) has exactly
    the fields of ROW_FIELDS, so one reader serves every operator."""
    docs = {}
    for op, case in (("gelu", "none"), ("conv2d", "batch1")):
        assert (
            main(
                [
                    "ops",
                    "check",
                    "--op",
                    op,
                    "--impl",
                    "aten",
                    "--impl",
                    "python",
                    "--dtype",
                    "float32",
                    "--case",
                    case,
                    "--n",
                    "64",
                    "--json",
                ]
            )
            == 0
        )
        docs[op] = __import__("json").loads(capsys.readouterr().out)
    for op, doc in docs.items():
        rows = doc["rows"] + doc["autograd_rows"]
        assert len(doc["rows"]) == 2 and len(doc["autograd_rows"]) == 2
        assert all(list(r) == list(check.ROW_FIELDS) for r in rows), op
        assert all(r["op"] == op and r["ok"] is True for r in rows)
    gelu, conv = docs["gelu"]["rows"][1], docs["conv2d"]["rows"][1]  # the python rung of each
    for key in ("fwd_max_abs_err", "grad_max_abs_err", "worst_ratio_to_tol", "fwd_vs_aten", "grad_vs_aten"):
        assert isinstance(gelu[key], float) and isinstance(conv[key], float), key
    assert gelu["checks"]["recipe_loss_diff"] == 0.0 and conv["checks"] is None  # a case's own checks, in one field


def test_autograd_is_handed_only_tensors_on_the_rungs_device():
    x = torch.zeros(3, device="meta", requires_grad=True)
    with pytest.raises(check.DeviceMismatch, match=r"on cpu, the rung runs on meta"):
        check.grad(x * 2, [x], torch.ones(3), torch.device("meta"))
    (g,) = check.grad(x * 2, [x], torch.ones(3, device="meta"), torch.device("meta"))
    assert g.device.type == "meta"


def _neutral_compare(value, ref, tol, bound):
    return {"max_abs": 0.0, "max_rel": 0.0, "ratio": 0.0, "within": True, "nonfinite_ok": True}


META_CASES = [dataclasses.replace(c, extra=None) for op in registry.OPS for c in check.CASES[op]]


@pytest.mark.parametrize("impl", ["aten", "python"])
@pytest.mark.parametrize("case", META_CASES, ids=lambda c: f"{c.op}-{c.name}")
def test_every_case_runs_entirely_on_the_rungs_device(monkeypatch, case, impl):
    """Run every case with the rung's device set to `meta` (shapes only, no data): any tensor the
    harness leaves on the CPU — the reference's dy, a bound — meets a meta tensor in autograd and the
    row fails. This is how the GPU-only failure "invalid gradient at index 0 - expected device cuda:0
    but got cpu" of conv_relu_pool2d showed up on the old code (dy64 on the CPU in its bound): here it
    fails on a CPU. Values cannot be compared on meta, so `compare` is neutral in this test."""
    monkeypatch.setattr(check, "availability", lambda impl: (None, torch.device("meta")))
    monkeypatch.setattr(check, "compare", _neutral_compare)
    monkeypatch.setattr(check, "_max_diff", lambda a, b: 0.0)
    row = check.check_row(case, impl, torch.float32, batch=2, n=16)
    if case.impls is not None and impl not in case.impls:  # a case this rung cannot run (average pooling)
        assert row["skipped"] and row["by_design"] and row["ok"] is None
        return
    assert row["device"] == "meta"
    assert row["ok"] is True, row["reason"]


def test_the_toy_operator_of_the_architecture_doc_is_its_folder_plus_one_registry_line(monkeypatch):
    """docs/architecture.md's worked example, run: the module it shows, registered by name only,
    is checked and timed by the shared harness with nothing else touched."""
    import re
    import sys
    import types
    from pathlib import Path

    from trainlab.ops import bench

    doc = (Path(__file__).resolve().parent.parent / "docs" / "architecture.md").read_text()
    source = re.search(r"```python\n# src/trainlab/ops/square/__init__.py\n(.*?)```", doc, re.S).group(1)
    module = types.ModuleType("trainlab.ops.square")
    exec(compile(source, "docs/architecture.md", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "trainlab.ops.square", module)
    monkeypatch.setattr(registry, "OPS", (*registry.OPS, "square"))  # the one registry line
    # what check and bench gathered from the registry when they were imported, gathered again
    monkeypatch.setattr(check, "OPS", registry.OPS)
    monkeypatch.setitem(check.CASES, "square", registry.module("square").CASES)
    monkeypatch.setattr(bench, "LAYERS", (*bench.LAYERS, *registry.module("square").BENCH))
    result = check.run_check(ops=["square"], impls=["aten", "python"], batch=3)
    assert result["ok"] and len(result["rows"]) == 4 and len(result["autograd_rows"]) == 2
    timed = bench.run_layer_bench(
        batches=[4], impls=["python"], layers=["square"], device="cpu", budget_s=0.01, min_runs=2, warmup=0
    )
    assert {r["impl"] for r in timed["rows"]} == {"aten", "python"}
