"""`trainlab gpt bench` / `compare`: FLOPs formulas, JSON contract, same-start guarantee, bad input."""

import json
import math
import os
import subprocess
import sys

import pytest

from trainlab.cli import main
from trainlab.gpt.bench import run_bench, token_batches
from trainlab.gpt.compare import _classify, run_compare
from trainlab.gpt.config import CompareConfig, GPTBenchConfig
from trainlab.gpt.flops import (
    attention_flops_per_token,
    flops_per_token,
    handout_tflops,
    hardware_flops_per_token,
    mfu,
)
from trainlab.gpt.shape import count_params, get_preset
from trainlab.report.sections.gpt import BENCH_KEYS

TINY = [
    "--model",
    "tiny",
    "--device",
    "cpu",
    "--steps",
    "2",
    "--warmup",
    "1",
    "--global-batch",
    "4",
    "--micro-batch",
    "4",
    "--seq",
    "32",
]


def test_flops_formulas_by_hand():
    cfg = get_preset("tiny")  # C=64, L=4, T=64, V=512
    N = count_params(cfg)
    assert (
        N == 512 * 64 + 64 * 64 + 4 * (4 * 64 + 4 * (64 * 64 + 64) + 64 * 256 + 256 + 256 * 64 + 64) + 2 * 64 == 236_928
    )
    assert attention_flops_per_token(cfg, 64) == 12 * 4 * 64 * 64 == 196_608
    assert flops_per_token(cfg, 64) == 6 * 236_928 + 196_608 == 1_618_176
    assert flops_per_token(cfg, 64, checkpointing=True) == 8 * 236_928 + 196_608
    assert hardware_flops_per_token(cfg, 64, "full") == 8 * 236_928 + 196_608 + 65_536
    assert hardware_flops_per_token(cfg, 64, "selective") == 1_618_176 + 16 * 4 * 64 * 64
    # the handout's get_tflops: numel · batch · seq · 8 / 1e12 / step_time
    assert handout_tflops(1_557_611_200, 8, 1024, 2.0) == pytest.approx(1_557_611_200 * 8 * 1024 * 8 / 1e12 / 2.0)
    assert mfu(494.5, 989.0) == pytest.approx(0.5)
    assert mfu(1.0, None) is None
    # 1.6B: 6N dominates; attention adds 12·48·1600·1024 = 0.94 GFLOP per token
    big = get_preset("gpt2-1.6b")
    assert flops_per_token(big, 1024) == pytest.approx(6 * 1_557_611_200 + 12 * 48 * 1600 * 1024)


def test_tokens_are_seeded_and_identical_across_calls():
    a = list(token_batches(512, 4, 16, 3, seed=1))
    b = list(token_batches(512, 4, 16, 3, seed=1))
    c = list(token_batches(512, 4, 16, 3, seed=2))
    assert all((x == y).all() for x, y in zip(a, b))
    assert not (a[0] == c[0]).all()
    assert a[0].max() < 512 and a[0].min() >= 0


def test_bench_json_contract_and_run_dir(tmp_path, capsys):
    out_json, run_dir = tmp_path / "b.json", tmp_path / "run"
    assert main(["gpt", "bench", *TINY, "--strategy", "none", "--json", str(out_json), "--out", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("== trainlab") and "config:" in text  # header first
    assert "step 1/2" in text and "summary none" in text
    s = json.loads(out_json.read_text())
    for key in (*BENCH_KEYS, "losses"):  # every key the report's bench table reads
        assert key in s, key
    assert s["strategy"] == "none" and s["world_size"] == 1 and s["params"] == 236_928
    assert len(s["losses"]) == 3 and all(math.isfinite(x) for x in s["losses"])
    assert abs(s["losses"][0] - math.log(512)) < 0.1  # random init on uniform tokens: ≈ ln V
    assert s["loss_floor_uniform_tokens"] == pytest.approx(math.log(512))  # the floor, stated beside it
    assert "floor for uniform random tokens: ln V = ln 512 = 6.24" in text
    assert s["step_seconds_median"] > 0
    assert s["tokens_per_s"] == pytest.approx(4 * 32 / s["step_seconds_median"])
    assert s["tflops_per_device"] == pytest.approx(flops_per_token(get_preset("tiny"), 32) * s["tokens_per_s"] / 1e12)
    # the handout's N (its get_model_size: tied 512×64 embedding twice) and the distinct N
    assert s["params_handout"] == 236_928 + 512 * 64
    assert s["tflops_per_device_handout"] == pytest.approx(
        handout_tflops(236_928 + 512 * 64, 4, 32, s["step_seconds_median"])
    )
    assert s["tflops_per_device_8n"] == pytest.approx(handout_tflops(236_928, 4, 32, s["step_seconds_median"]))
    assert s["tf32"] == {"matmul_allow_tf32": False, "cudnn_allow_tf32": False, "float32_matmul_precision": "highest"}
    assert s["config"]["tf32"] == "off"
    # in-run prediction (the plan the run resolved) = the pre-flight one (`GPTBenchConfig.plan`, the same flags)
    pre = GPTBenchConfig(model="tiny", device="cpu", steps=2, warmup=1, global_batch=4, micro_batch=4, seq=32).plan()
    assert s["predicted_peak_bytes"] == pre.predicted_peak_bytes > 0
    assert s["config"]["strategy"]["text"] == "none" and s["config"]["device"] == "cpu"  # config.json is the plan
    assert 0 < s["mfu"] < 5 and s["peak_memory_bytes"] > 10**7
    assert (
        (run_dir / "summary.json").exists() and (run_dir / "config.json").exists() and (run_dir / "env.json").exists()
    )
    assert any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3


def test_bench_json_dash_prints_only_the_summary(capsys):
    """`--json -` (as on every command): the summary JSON alone on stdout, the progress lines on stderr."""
    assert main(["gpt", "bench", *TINY, "--json", "-"]) == 0
    out, err = capsys.readouterr()
    s = json.loads(out)
    assert s["strategy"] == "none" and len(s["losses"]) == 3
    assert "step 1/2" in err and "summary none" in err


def test_same_seed_same_start_across_strategies_and_impls():
    """none, accum and the HF model (+ckpt) start from the same weights, see the same tokens, train alike."""
    base = dict(model="tiny", device="cpu", steps=2, warmup=0, global_batch=4, micro_batch=4, seq=32, seed=3)
    ref = run_bench(GPTBenchConfig(strategy="none", **base).plan(), log=lambda *a: None)["losses"]
    accum = run_bench(GPTBenchConfig(strategy="accum", **{**base, "micro_batch": 2}).plan(), log=lambda *a: None)[
        "losses"
    ]
    hf = run_bench(GPTBenchConfig(strategy="ckpt", impl="hf", **base).plan(), log=lambda *a: None)["losses"]
    assert accum == pytest.approx(ref, abs=1e-5)
    assert hf == pytest.approx(ref, abs=1e-4)  # HF GPT2LMHeadModel with gradient checkpointing


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--model", "gpt5"], "--model"),
        (["--micro-batch", "3"], "--micro-batch"),
        (["--strategy", "warp"], "--strategy"),
        (["--strategy", "ddp+zero3"], "--strategy"),
        (["--steps", "0"], "--steps"),
        (["--nproc", "2"], "--nproc"),  # strategy none is single-process
        (["--strategy", "tp", "--nproc", "2", "--tp", "3"], "--"),
        (["--seq", "999"], "--seq"),
        (["--device", "cuda"], "--device"),
    ],
)
def test_bench_bad_input_is_one_line_exit_2(argv, flag, capsys):
    args = list(TINY)
    for i in range(0, len(argv), 2):  # override defaults in TINY
        if argv[i] in args:
            j = args.index(argv[i])
            del args[j : j + 2]
    if "--device" in argv and __import__("torch").cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["gpt", "bench", *args, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainlab: error:") and flag in err and "\n" not in err


def test_compare_classifies_failures():
    assert _classify(0, "") == "ok"
    assert _classify(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") == "OOM"
    assert _classify(1, "RuntimeError: DefaultCPUAllocator: can't allocate memory") == "OOM"
    assert _classify(2, "trainlab: error: --tp 3: must divide") == "invalid"
    assert (
        _classify(3, "trainlab: error: gpt bench: the loss became non-finite (nan on rank 0) at step 2") == "diverged"
    )
    assert _classify(-9, "Killed") == "failed"


def test_compare_runs_isolated_and_writes_tables(tmp_path):
    bench = GPTBenchConfig(model="tiny", device="cpu", steps=2, warmup=1, global_batch=4, micro_batch=4, seq=32)
    res = run_compare(CompareConfig(bench=bench, strategies="none,tp", out=str(tmp_path)), log=lambda *a: None)
    rows = {r["strategy"]: r for r in res["rows"]}
    assert rows["none"]["status"] == "ok" and rows["none"]["predicted_bytes"] > 0
    assert rows["tp"]["status"] == "invalid"  # tp on one process: reported, not a crash
    # on CPU each run also counts live tensor bytes: the planner's prediction is within 15% of it
    assert abs(rows["none"]["predicted_bytes"] / rows["none"]["peak_tensor_bytes"] - 1) < 0.15
    md = (tmp_path / "compare.md").read_text()
    assert "| none |" in md and "**invalid**" in md
    assert (tmp_path / "compare.csv").read_text().startswith("strategy,")
    assert (tmp_path / "throughput.png").stat().st_size > 1000 and (tmp_path / "memory.png").exists()
    assert (tmp_path / "none.log").read_text().startswith("$ ")
    # the worker spec is the plan as JSON: what the worker ran, and the prediction the table shows
    from trainlab.gpt.plan import GPTPlan

    plan = GPTPlan.from_dict(json.loads((tmp_path / "none.spec.json").read_text())["plan"])
    assert plan.strategy.text == "none" and plan.predicted_peak_bytes == rows["none"]["predicted_bytes"]
    assert json.loads((tmp_path / "none.json").read_text())["predicted_peak_bytes"] == plan.predicted_peak_bytes


@pytest.mark.dist
def test_bench_nproc_2_relaunches_under_torchrun_and_matches_single_process(tmp_path):
    """--nproc 2 relaunches itself with torchrun; DDP losses equal single-process training's."""
    args = ["-m", "trainlab", "gpt", "bench", *TINY, "--micro-batch", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = tmp_path / "ddp.json"
    proc = subprocess.run(
        [sys.executable, *args, "--strategy", "ddp", "--nproc", "2", "--json", str(ddp)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "launching 2 workers (torch.distributed elastic agent)" in proc.stdout
    single = run_bench(
        GPTBenchConfig(model="tiny", device="cpu", steps=2, warmup=1, global_batch=4, micro_batch=2, seq=32).plan(),
        log=lambda *a: None,
    )
    d = json.loads(ddp.read_text())
    assert d["world_size"] == 2 and len(d["peak_memory_per_rank"]) == 2
    assert d["losses"] == pytest.approx(single["losses"], abs=1e-5)


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--strategies", "none,warp"], "--strategy"),
        (["--timeout", "0"], "--timeout"),
        (["--model", "gpt5"], "--model"),
    ],
)
def test_compare_bad_input_is_one_line_exit_2(argv, flag, tmp_path, capsys):
    assert main(["gpt", "compare", *TINY, "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainlab: error:") and flag in err and "\n" not in err


@pytest.mark.gpu
def test_bench_on_cuda_reports_allocator_peaks(tmp_path):
    s = run_bench(
        GPTBenchConfig(
            model="tiny", device="cuda", strategy="amp", steps=2, warmup=1, global_batch=4, micro_batch=4, seq=32
        ).plan(),
        log=lambda *a: None,
    )
    mem = s["peak_memory_per_rank"][0]
    assert mem["peak_allocated_bytes"] > 0 and mem["peak_reserved_bytes"] >= mem["peak_allocated_bytes"]
    assert s["peak_memory_kind"] == "allocated" and s["peak_tflops"] is not None and 0 < s["mfu"] < 1
