"""`trainlab lab --plan` replayed for the course's hardware and the lent H100 (issue 31): every GPT row the
lab plans fits by the memory planner — computed here through `gpt compare`'s own per-strategy settings,
not the lab's — and every planned step can run there: its command line parses with trainlab's own
parser, its strategies pass `gpt bench`'s checks on that many GPUs of that compute capability (no bf16
on sm75), no row assumes flash attention on sm75, and no step asks for more GPUs than there are."""

from __future__ import annotations

import shlex

import pytest
import torch

from trainlab.cli import build_parser, main
from trainlab.flags import explicit_values
from trainlab.gpt import planner
from trainlab.gpt.config import COMPARE_EXCLUDED_BENCH_FLAGS, CompareConfig, GPTBenchConfig, plan_for_strategy
from trainlab.gpt.plan import Machine
from trainlab.gpt.strategy import parse_strategy
from trainlab.lab.machine import detect_hardware, parse_sm
from trainlab.lab.plan import plan_gpt
from trainlab.lab.steps import lab_steps
from trainlab.lenet.config import CompareConfig as DpCompareConfig
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.plan import AMP_DTYPES, _precision

HARDWARE = {  # the lent H100; the course's GPU08 (2×A100 80GB) and GPU06 (RTX 2080 Ti, 11 GB)
    "1xH100-80G": (["--device-name", "NVIDIA H100 80GB HBM3", "--gpus", "1", "--gpu-mem", "80GiB"], 1, 90),
    "2xA100-80G": (["--gpus", "2", "--gpu-mem", "80GiB", "--sm", "80"], 2, 80),
    "2xRTX2080Ti": (["--device-name", "NVIDIA GeForce RTX 2080 Ti", "--gpus", "2", "--gpu-mem", "11GB"], 2, 75),
    # the data sheet's 11 GB (issue 37: without --gpu-mem it planned 80 GiB cards)
    "2xRTX2080Ti-table": (["--device-name", "NVIDIA GeForce RTX 2080 Ti", "--gpus", "2"], 2, 75),
}


def _fake_gpus(monkeypatch, n: int, sm: int, name: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (sm // 10, sm % 10))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)


def _args(step):
    """The step's command parsed by trainlab's own parser (`python -m trainlab ARGS`)."""
    argv = step.command.argv("/tmp/lab-step")
    assert argv[1:3] == ["-m", "trainlab"], argv
    return build_parser().parse_args(argv[3:])


@pytest.mark.parametrize("hw_name", list(HARDWARE))
def test_replayed_lab_plan_fits_and_runs_on_the_hardware(hw_name, capsys, monkeypatch, tmp_path):
    flags, gpus, sm = HARDWARE[hw_name]
    assert main(["lab", "--out", str(tmp_path / "lab"), "--plan", "--budget", "3h", *flags]) == 0
    printed = capsys.readouterr().out
    assert not (tmp_path / "lab").exists()  # --plan writes nothing
    assert "runs (from" in printed, printed
    # every step runs, except those this GPU cannot do at all: below sm80 no TF32 and no bf16 rows, each
    # with its reason (the 2080 Ti's plan still holds every deliverable)
    not_run = [line for line in printed.splitlines() if "not run" in line]
    assert all(sm < 80 and "needs sm80+" in line for line in not_run), not_run
    if sm < 80:  # TF32 alone: the ablation and offload run in fp16 with a GradScaler (issue 37)
        assert {line.split()[0] for line in not_run} == {"lenet_tf32", "gpt_baseline_tf32"}
    hw = detect_hardware(
        "auto",
        dict(zip(flags[::2], flags[1::2])).get("--device-name"),
        gpus,
        None,
        flags[flags.index("--gpu-mem") + 1] if "--gpu-mem" in flags else None,
        True,
        parse_sm(dict(zip(flags[::2], flags[1::2])).get("--sm")),
    )
    assert (hw.gpus, hw.sm) == (gpus, sm)
    steps = {s.name: s for s in lab_steps(hw, "full")}
    gp = plan_gpt(gpus, hw.memory_bytes, sm)
    budget = planner.usable_bytes(hw.memory_bytes)

    _fake_gpus(monkeypatch, gpus, sm, hw.name)
    machine = Machine(
        gpus=gpus, sm=sm, memory_bytes=hw.memory_bytes
    )  # the hardware planned for, described: its plans are checked as gpt bench's
    checked = []
    for name in ("gpt_best", "gpt_baseline", "gpt_strategies", "gpt_offload"):
        args = _args(steps[name])
        if name in ("gpt_strategies", "gpt_offload"):
            cc = CompareConfig(
                bench=GPTBenchConfig(**explicit_values(args, GPTBenchConfig, exclude=COMPARE_EXCLUDED_BENCH_FLAGS)),
                **explicit_values(args, CompareConfig),
            )
            cc.validate()
            runs = [plan_for_strategy(cc.bench, s) for s in cc.strategy_list if "nvme" not in s]
            assert len({r.global_batch for r in runs}) == 1  # the same data for every row
        else:
            runs = [GPTBenchConfig(**explicit_values(args, GPTBenchConfig))]
        for run in runs:
            run.plan(
                machine
            )  # gpt bench's own checks on this many GPUs of this compute capability (bf16 below sm80 fails)
            assert run.nproc <= gpus
            ours = (
                run if run.impl == "ours" else GPTBenchConfig(**{**run.to_dict(), "impl": "ours"})
            )  # HF: our model's prediction
            plan = ours.plan(machine)
            need = plan.predicted_peak_bytes
            assert need is not None and need <= budget, (hw_name, run.strategy, need / 2**30)
            spec, attention = plan.strategy, plan.attention
            if sm < 80:
                assert spec.amp != "bf16", run.strategy
                assert attention.backend not in ("flash", "cudnn"), (run.strategy, attention)
            checked.append((run.strategy, run.nproc, need))
    strategies = [s for s, n, _ in checked]
    if gpus > 1:  # 1 vs N GPUs on the same global batch, and every way of splitting the model
        amp = "amp" if sm >= 80 else "fp16"
        assert any(n == 1 and parse_strategy(s).amp for s, n, _ in checked)
        for kind in ("ddp", "zero2", "zero3", "tp", "pp"):
            assert any(s.split("+")[0] == kind and n == gpus for s, n, _ in checked), (kind, strategies)
        assert all(parse_strategy(s).amp or s.startswith("pp") for s in strategies if not s.startswith("ckpt")), (
            strategies
        )
        assert amp in printed
    assert gp.model == ("gpt2-1.6b" if sm >= 80 else "gpt2-medium")  # 1.6B cannot fit an 11 GB card
    import importlib.util

    nvme_flag = "gpt_offload: amp+nvme: DeepSpeed is not installed (`pip install .[offload]`)"
    assert (nvme_flag in printed) == (sm >= 80 and importlib.util.find_spec("deepspeed") is None), printed
    assert gp.offload_model == "gpt2-1.6b"  # ... but with fp16+ckpt+offload it does (the handout's CPU offload)
    assert steps["gpt_offload"].config.bench.model == "gpt2-1.6b"
    # the gpt_best row printed is the step's run: its strategy and micro-batch
    best = steps["gpt_best"].config
    assert (best.strategy, best.micro_batch, best.micro_batch_auto) == (gp.best.strategy, gp.best.micro_batch, False)
    assert f"gpt_best         {gp.best.strategy:<24} {1:>4} {gp.best.micro_batch:>5}" in printed
    ablation = steps["gpt_ablation"].config
    assert (
        ("fp16" in ablation.changes.split(",") and "bf16" not in ablation.changes)
        if sm < 80
        else "bf16" in ablation.changes
    )
    for r in gp.rows:
        assert f"{r.strategy:<24} {r.nproc:>4}" in printed

    # LeNet and data-parallel steps: valid commands, amp resolved for this GPU, no more ranks than GPUs
    for name in ("lenet_train", "gelu_train", "ops_train"):
        args = _args(steps[name])
        cfg = TrainConfig(**explicit_values(args, TrainConfig))
        assert AMP_DTYPES.get(_precision(cfg.amp, torch.device("cuda"))) is (
            torch.bfloat16 if sm >= 80 else torch.float16
        )
    for name in ("dp_compare", "dp_weak"):
        if name not in steps:
            assert gpus == 1
            continue
        cfg = DpCompareConfig(**explicit_values(_args(steps[name]), DpCompareConfig))
        assert cfg.nproc <= gpus and ("dp" not in cfg.modes.split(",") or gpus > 1)
        cfg.validate()  # `dp compare`'s own checks, these GPUs
    if gpus > 1:
        strong, weak = steps["dp_compare"].config, steps["dp_weak"].config  # parsed back: test_lab_commands
        assert set(strong.modes.split(",")) == {"none", "dp", "ddp", "allreduce", "ring"}
        assert weak.batch_size == strong.batch_size * gpus  # weak scaling: the per-GPU batch kept
    print(hw_name, shlex.join(["trainlab", "lab", "--plan", *flags]))
