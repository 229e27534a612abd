"""GPU telemetry without a GPU: degrade cleanly; with a fake NVML: sample, summarize, write CSV."""

import csv
import sys
import time
import types

import torch

from trainlab.telemetry.env import collect_env, format_header
from trainlab.telemetry.gpu import FIELDS, GPUSampler
from trainlab.telemetry.tensorboard import image_grid


def fake_nvml(util=(40, 90), mem_mib=1234):
    calls = {"n": 0}

    class NVMLError(Exception):
        pass

    def utilization(_h):
        calls["n"] += 1
        return types.SimpleNamespace(gpu=util[calls["n"] % 2])

    return types.SimpleNamespace(
        NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetMemoryInfo=lambda _h: types.SimpleNamespace(used=mem_mib * 2**20, total=80 * 2**30),
        nvmlDeviceGetPowerUsage=lambda _h: 250_000, nvmlDeviceGetTemperature=lambda _h, _s: 61,
    )


def test_sampler_records_fake_gpu_and_writes_csv(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    messages = []
    sampler = GPUSampler(interval_s=0.01, log=messages.append)
    assert sampler.available and not messages
    with sampler:
        deadline = time.time() + 5
        while len(sampler.samples) < 5 and time.time() < deadline:
            time.sleep(0.01)
    assert len(sampler.samples) >= 5
    s = sampler.samples[0]
    assert s["memory_used_mib"] == 1234 and s["power_w"] == 250.0 and s["temperature_c"] == 61
    summary = sampler.summary()
    assert summary["utilization_max_pct"] == 90 and 40 <= summary["utilization_mean_pct"] <= 90
    sampler.write_csv(tmp_path / "gpu.csv")
    rows = list(csv.DictReader((tmp_path / "gpu.csv").open()))
    assert list(rows[0]) == FIELDS and len(rows) == len(sampler.samples)


def test_sampler_without_nvml_says_so_once(monkeypatch):
    broken = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("NVML Shared Library Not Found")))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    messages = []
    sampler = GPUSampler(log=messages.append)
    sampler.start()
    assert not sampler.available and sampler.stop() == [] and sampler.summary() is None
    assert len(messages) == 1 and "skipped" in messages[0] and "NVML Shared Library Not Found" in messages[0]


def test_env_and_header():
    env = collect_env("cpu")
    assert env["torch"] == torch.__version__ and env["cpu_count"] >= 1
    header = format_header({"epochs": 3, "act": "relu"}, env)
    assert "torch " + torch.__version__ in header and "epochs = 3" in header.replace("  ", " ")


def test_image_grid_layout_and_range():
    grid = image_grid(torch.arange(6 * 25, dtype=torch.float32).view(6, 5, 5), ncol=3, pad=1)
    assert grid.shape == (1, 2 * 6 + 1, 3 * 6 + 1)
    assert float(grid.min()) == 0.0 and float(grid.max()) == 1.0
