"""`ops bench` totals: every ratio compares the same layers (issue 29: the `cuda-atomic` "all layers"
line summed only the pools and was divided by aten's all layers)."""

import math

import pytest

from trainlab.ops import bench, registry


def _row(batch, layer, impl, fwd, bwd):
    return {"batch": batch, "layer": layer, "impl": impl, "fwd_median_s": fwd, "bwd_median_s": bwd}


def test_layers_come_from_every_operators_folder_in_lenet_order():
    assert bench.LAYER_NAMES == (
        "conv1",
        "relu1",
        "conv1+relu",
        "pool1",
        "stage1",
        "conv2",
        "relu2",
        "conv2+relu",
        "pool2",
        "fc1",
        "relu3",
        "fc1+relu",
        "fc2",
        "relu4",
        "fc2+relu",
        "fc3",
    )
    assert {layer.op for layer in bench.LAYERS} == {op for op in registry.OPS if registry.module(op).BENCH}


def test_totals_sum_only_layers_every_rung_timed():
    step = [layer.name for layer in bench.LAYERS if "layers" in layer.steps]
    rows = [_row(256, name, "aten", 1.0, 2.0) for name in step]
    rows += [_row(256, name, "cuda", 2.0, 2.0) for name in step if name != "fc3"]  # failed at fc3
    rows += [_row(256, name, "cuda-atomic", 0.5, 0.5) for name in ("pool1", "pool2")]
    rows += [_row(256, "stage1", impl, 9.0, 9.0) for impl in ("aten", "cuda")]  # fused stage: not in a step
    totals = {t["impl"]: t for t in bench._totals(rows) if t["step"] == "layers"}
    common = [n for n in step if n != "fc3"]
    assert totals["aten"]["layers"] == totals["cuda"]["layers"] == common
    assert totals["aten"]["fwd_s"] == pytest.approx(len(common)) and totals["cuda"]["fwd_s"] == pytest.approx(
        2 * len(common)
    )
    assert totals["cuda"]["ratio_to_aten"] == pytest.approx(4 / 3)
    # the pool-only rung is divided by aten's pools, not by aten's whole step
    assert totals["cuda-atomic"]["layers"] == ["pool1", "pool2"]
    assert totals["cuda-atomic"]["ratio_to_aten"] == pytest.approx(1 / 3)
    table = bench.format_layer_table(
        {"device": "cuda", "torch_threads": 1, "rows": [], "skipped": {}, "totals": list(totals.values())}
    )
    assert "(pool1, pool2 only)" in table and table.count("only)") == 1


def test_the_relu_epilogue_step_sums_the_fused_layers_pools_and_fc3():
    """The second total is the step `train --ops own=triton` runs: each conv/linear with its ReLU, the
    pools and fc3 — every other LeNet layer once, no layer twice, none of the unfused conv/ReLU rows."""
    rows = [
        _row(256, layer.name, impl, 1.0, 1.0) for layer in bench.LAYERS for impl in ("aten", "triton", "cuda-atomic")
    ]
    epilogue = [t for t in bench._totals(rows) if t["step"] == "relu-epilogue"]
    assert {t["impl"] for t in epilogue} == {"aten", "triton"}  # the pool-only rung: counted once, under layers
    assert epilogue[0]["layers"] == ["conv1+relu", "pool1", "conv2+relu", "pool2", "fc1+relu", "fc2+relu", "fc3"]
    assert all(t["ratio_to_aten"] == pytest.approx(1.0) for t in epilogue)
    table = bench.format_layer_table(
        {"device": "cuda", "torch_threads": 1, "rows": [], "skipped": {}, "totals": epilogue}
    )
    assert table.count("relu-epilogue") == 3 and "only)" not in table


def test_gpu_layer_profile_runs_at_toy_sizes_and_refuses_bad_flags(tmp_path, monkeypatch, capsys):
    """benchmarks/gpu_layer_profile.py --dry-run (the CPU, Triton interpreted): a row per rung and phase, the
    TF32-off rows under --ieee, written once (a second run without --force refuses); bad flags: one line."""
    import importlib
    import json
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the dry run sets it: restored after the test
    profile = importlib.import_module("gpu_layer_profile")
    monkeypatch.setattr(sys, "argv", ["gpu_layer_profile.py"])
    base = ["--out", str(tmp_path), "--dry-run"]
    assert profile.main([*base, "--layers", "relu3", "--ieee"]) == 0
    rows = json.loads((tmp_path / "layer_profile.json").read_text())["rows"]
    assert {(r["impl"], r["phase"]) for r in rows} == {
        (i, p) for i in ("aten", "triton", "aten-ieee", "triton-ieee") for p in ("fwd", "bwd")
    }
    # the backward row is (forward+backward) minus the forward measured just before: on the CPU an ATen backward
    # of microseconds can come out below zero by noise, so what must hold is the measured pair, not the difference
    fwd = {r["impl"]: r for r in rows if r["phase"] == "fwd"}
    assert all(r["layer"] == "relu3" and math.isfinite(r["wall"]) for r in rows)
    assert all(r["wall"] > 0 for r in fwd.values())
    assert all(r["wall"] + fwd[r["impl"]]["wall"] > 0 for r in rows if r["phase"] == "bwd")
    for args, code, expected in (
        (["--layers", "relu3"], None, "exists; pass --force"),  # benchmarks/_common.check_output: sys.exit(line)
        (["--batch", "0"], 2, "--batch 0: expected a positive integer"),
        (["--layers", "conv9"], 2, "--layers 'conv9': choose from"),
        (["--impls", "foo"], 2, "--impls 'foo': expected"),
    ):
        with pytest.raises(SystemExit) as stop:
            profile.main([*base, *args])
        line = str(stop.value.code) if code is None else capsys.readouterr().err.strip().splitlines()[-1]
        assert (code is None or stop.value.code == code) and expected in line, (args, line)


def test_bench_records_what_triton_autotune_chose(monkeypatch):
    """`ops bench` writes `triton_tuning`: per compiled kernel, each autotune key and the config that won
    (read from the tuners' caches; here one entry put there by hand, since a CPU tunes nothing)."""
    triton = pytest.importorskip("triton")
    from trainlab.ops.gelu import gelu_triton

    def _toy_kernel(x_ptr, BLOCK):  # never launched: only its tuner's cache is read
        pass

    tuner = gelu_triton.tuned_object(_toy_kernel, False, [({"BLOCK": 256}, 4, 1)], ["n"], {"BLOCK": 256})
    monkeypatch.setattr(tuner, "cache", {(4096, "torch.float32"): triton.Config({"BLOCK": 256}, num_warps=4)})
    try:
        chosen = bench._tuning(["aten", "triton"])["_toy_kernel"]
        assert chosen == [{"key": ["4096", "torch.float32"], "config": str(tuner.cache[(4096, "torch.float32")])}]
        assert "BLOCK: 256" in chosen[0]["config"] and bench._tuning(["aten", "cpp"]) == {}
    finally:
        gelu_triton._kernels.pop((_toy_kernel, False, "tuned"), None)
        gelu_triton._kernels.pop((_toy_kernel, False), None)
