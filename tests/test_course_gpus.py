"""The course's GPUs (issue 31): the RTX 2080 Ti (sm75) trains in fp16 with a GradScaler, never bf16;
a GPU that is present but unusable (driver too old for the torch build, a CPU-only torch) is named in
one line before `--device auto` goes on on the CPU; `make` checks the driver before installing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from trainlab import cuda_driver, device, hardware
from trainlab.errors import HardwareError
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.plan import AMP_DTYPES, _precision


def amp_dtype(cfg: TrainConfig, dev: torch.device):
    """The autocast type the LeNet plan resolves --amp to on `dev` (lenet.plan.resolve's precision)."""
    return AMP_DTYPES.get(_precision(cfg.amp, dev))


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("sm,amp", [(75, "fp16"), (70, "fp16"), (80, "bf16"), (86, "bf16"), (90, "bf16"), (None, None)])
def test_amp_follows_the_compute_capability(sm, amp):
    assert hardware.amp_for_sm(sm) == amp


def _fake_gpu(monkeypatch, sm: int, name: str = "NVIDIA GeForce RTX 2080 Ti"):
    monkeypatch.setattr(device, "cuda_sm", lambda d=None: sm)
    monkeypatch.setattr("trainlab.lenet.plan.cuda_sm", lambda d=None: sm)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)


def test_lenet_amp_is_fp16_on_a_2080ti(monkeypatch):
    """auto, and bf16 (the fast preset's), are fp16 on sm75: it has no bf16 (the summary records float16)."""
    _fake_gpu(monkeypatch, 75)
    cuda = torch.device("cuda")
    for amp in ("auto", "bf16", "fp16"):
        assert amp_dtype(TrainConfig(amp=amp), cuda) is torch.float16
    assert amp_dtype(TrainConfig(amp="off"), cuda) is None
    _fake_gpu(monkeypatch, 80, "NVIDIA A100-SXM4-80GB")
    assert amp_dtype(TrainConfig(amp="auto"), cuda) is torch.bfloat16
    assert amp_dtype(TrainConfig(amp="fp16"), cuda) is torch.float16
    assert amp_dtype(TrainConfig(amp="auto"), torch.device("cpu")) is None


@pytest.mark.parametrize("units", [True, False])
def test_bf16_on_a_cpu_is_bf16_only_where_the_cpu_has_bf16_units(monkeypatch, units):
    """The fast preset's bf16 on a CPU: its bf16 units where it has them (AVX512-BF16/AMX), else fp32, which
    was 3.7x faster than emulated bf16 on an AVX2-only box. `auto` stays fp32 on every CPU."""
    monkeypatch.setattr("trainlab.lenet.plan.cpu_has_bf16", lambda: units)
    cpu = torch.device("cpu")
    assert amp_dtype(TrainConfig(amp="bf16"), cpu) is (torch.bfloat16 if units else None)
    assert amp_dtype(TrainConfig(amp="auto"), cpu) is None and amp_dtype(TrainConfig(amp="fp16"), cpu) is torch.float16


def test_the_cpu_bf16_check_is_onednns():
    """hardware.cpu_has_bf16 is oneDNN's own answer, not a guess from /proc/cpuinfo."""
    assert hardware.cpu_has_bf16() is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_gpt_bf16_strategy_is_refused_below_sm80():
    """The check lives in the plan (gpt.plan.resolve), so a described sm75 machine is refused as a real one."""
    from trainlab.gpt.config import GPTBenchConfig
    from trainlab.gpt.plan import Machine, resolve

    sm75 = Machine(gpus=2, sm=75)
    cfg = dict(model="tiny", nproc=2, global_batch=8, micro_batch=4, device="cuda")
    with pytest.raises(HardwareError, match=r"--strategy ddp\+amp: bf16: .*sm75.* use fp16"):
        resolve(GPTBenchConfig(strategy="ddp+amp", **cfg), sm75)
    assert resolve(GPTBenchConfig(strategy="ddp+fp16", **cfg), sm75).strategy.amp == "fp16"  # fine
    assert resolve(GPTBenchConfig(strategy="ddp+amp", **cfg), Machine(gpus=2, sm=80)).strategy.amp == "bf16"


def test_lenet_fp16_is_never_a_cuda_graph(monkeypatch):
    """fp16's GradScaler decides on the host whether to step: `auto` picks no graph, cudagraph is refused."""
    from trainlab.errors import ConfigError
    from trainlab.lenet.plan import _step_mode

    cfg = TrainConfig(amp="auto", schedule="cosine")  # a recipe a graph can capture
    assert _step_mode(cfg, torch.device("cuda"), "aten", "fp16") == "eager"
    assert _step_mode(cfg, torch.device("cuda"), "aten", "bf16") == "cudagraph"
    with pytest.raises(ConfigError, match=r"--step-mode cudagraph: not with fp16 autocast"):
        _step_mode(TrainConfig(step_mode="cudagraph", schedule="cosine"), torch.device("cuda"), "aten", "fp16")


def test_fp16_training_goes_through_a_grad_scaler(tmp_path, monkeypatch):
    """fp16 autocast (CPU here, as on a 2080 Ti) with the loop's GradScaler: every step scaled, unscaled, stepped."""
    from trainlab.lenet.loop import train

    calls = {"scale": 0, "step": 0}

    class Counting(torch.amp.GradScaler):
        def scale(self, outputs):
            calls["scale"] += 1
            return super().scale(outputs)

        def step(self, optimizer, *a, **kw):
            calls["step"] += 1
            return super().step(optimizer, *a, **kw)

    monkeypatch.setattr(torch.amp, "GradScaler", Counting)
    summary = train(
        TrainConfig(
            epochs=1,
            train_subset=512,
            test_subset=256,
            batch_size=128,
            device="cpu",
            amp="fp16",
            progress=False,
            tensorboard=False,
            gpu_telemetry=False,
            out=str(tmp_path / "run"),
        ),
        log=lambda *a: None,
    )
    assert summary["amp"] == "float16"
    assert calls == {"scale": 4, "step": 4}  # 512 images / 128 per step
    assert summary["test_loss"] < 2.3026  # below ln 10, chance: the scaled steps did learn


def _no_cuda(monkeypatch, driver: str | None, cuda: str | None):
    monkeypatch.setattr(device, "_SAID_UNUSABLE", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cuda_driver, "driver_version", lambda: driver)
    monkeypatch.setattr(torch.version, "cuda", cuda)


@pytest.mark.parametrize(
    "driver,cuda,expected",
    [
        (
            "535.104.05",
            "13.0",
            "NVIDIA driver 535.104.05 is older than 580, which torch's CUDA 13.0 build needs: update "
            "the NVIDIA driver, or install PyPI's CUDA 12 build: `make clean setup TORCH_CUDA=cu126`",
        ),
        ("470.82.01", "12.6", "NVIDIA driver 470.82.01 is older than 525, which torch's CUDA 12.6 build needs"),
        ("580.159.04", None, "is a CPU-only build on a machine with NVIDIA driver 580.159.04: install a CUDA build"),
    ],
)
def test_device_auto_names_why_a_present_gpu_is_unusable(monkeypatch, capsys, driver, cuda, expected):
    _no_cuda(monkeypatch, driver, cuda)
    assert device.resolve_device("auto") == torch.device("cpu")
    assert device.resolve_device("auto") == torch.device("cpu")  # said once per process
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "trainlab: --device auto: the GPU is not usable, running on the CPU: "
    )
    assert expected in err


def test_gpt_and_ranks_pick_the_device_the_same_way(monkeypatch, capsys):
    from trainlab.distributed.launch import init_distributed

    _no_cuda(monkeypatch, "535.104.05", "13.0")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert init_distributed(device=None).device == torch.device("cpu")
    assert "older than 580" in capsys.readouterr().err


def test_device_auto_is_silent_without_a_gpu(monkeypatch, capsys):
    _no_cuda(monkeypatch, None, "13.0")
    assert device.resolve_device("auto") == torch.device("cpu") and capsys.readouterr().err == ""


def test_lab_device_auto_says_it_too(monkeypatch, capsys):
    from trainlab.lab.cli import detect_hardware

    _no_cuda(monkeypatch, "535.104.05", "13.0")
    hw = detect_hardware("auto", None, None, None, None, False)
    assert hw.kind == "cpu" and "older than 580" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,driver,rc,line",
    [
        ([], "535.104.05", 2, "make: NVIDIA driver 535.104.05 is older than 580"),
        (["--build", "cu126"], "535.104.05", 0, ""),
        (["--build", "cu118"], "535.104.05", 0, ""),
        ([], "580.65.06", 0, ""),
        ([], None, 0, ""),  # no GPU: nothing to check
        (["--build", "cu12"], "535.104.05", 2, "make: TORCH_CUDA='cu12': expected a PyTorch CUDA build name"),
    ],
)
def test_make_checks_the_driver_before_installing(monkeypatch, capsys, args, driver, rc, line):
    monkeypatch.setattr(cuda_driver, "driver_version", lambda: driver)
    assert cuda_driver.main(args) == rc
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == (1 if line else 0)


def test_driver_version_is_read_from_the_kernel_module(monkeypatch, tmp_path):
    text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)\n"
    real = Path.read_text
    monkeypatch.setattr(
        Path,
        "read_text",
        lambda self, *a, **k: text if str(self) == "/proc/driver/nvidia/version" else real(self, *a, **k),
    )
    assert cuda_driver.driver_version() == "580.159.04"


def _outside_make() -> dict:
    """The environment without make's own variables: under `make test` a nested `make -n` would print
    "make[1]: Entering directory" lines before the commands it shows."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}


def test_makefile_selects_the_cuda12_build_and_checks_the_driver_first():
    dry = subprocess.run(
        ["make", "-n", "-B", "setup", "train", "TORCH_CUDA=cu126", "VENV=/nonexistent/venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=_outside_make(),
    )
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0] == f"{'python3'} src/trainlab/cuda_driver.py --build cu126"
    install = next(x for x in lines if "-e '.[dev]'" in x)
    assert install.endswith("--extra-index-url https://download.pytorch.org/whl/cu126")
    assert (
        "src/trainlab/cuda_driver.py --build cu126"
        in lines[lines.index(next(x for x in lines if "trainlab train" in x)) - 1]
    )
    plain = subprocess.run(
        ["make", "-n", "-B", "setup", "VENV=/nonexistent/venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=_outside_make(),
    ).stdout
    assert "download.pytorch.org" not in plain and plain.splitlines()[0] == "python3 src/trainlab/cuda_driver.py "


def test_the_planner_knows_sm75_has_no_flash_attention():
    """sm75: no flash, no cuDNN attention; GPT-2 1.6B's head width 50 is not a multiple of 8 either, so
    fp16 falls back to the math path, which keeps the s×s scores: more memory than flash on sm80."""
    from trainlab.gpt.planner import predict_memory
    from trainlab.gpt.shape import get_preset

    big, medium = get_preset("gpt2-1.6b"), get_preset("gpt2-medium")
    on75 = predict_memory(big, "fp16", 1, 2, sm=75)
    on80 = predict_memory(big, "fp16", 1, 2, sm=80)
    assert on75["attention"]["backend"] == "math" and on75["attention"]["stores_scores"]
    assert on80["attention"]["backend"] == "flash"
    assert on75["activations_bytes"] > 1.5 * on80["activations_bytes"]
    assert predict_memory(medium, "fp16", 1, 2, sm=75)["attention"]["backend"] == "efficient"  # head_dim 64
