"""GPU telemetry without a GPU: degrade cleanly; with a fake NVML: sample, summarize, write CSV."""

import csv
import sys
import threading
import time
import types

import pytest
import torch

from trainlab.telemetry.env import collect_env, format_header
from trainlab.telemetry.gpu import FIELDS, GPUSampler
from trainlab.telemetry.tensorboard import image_grid

# A machine with 4 GPUs; NVML numbers them 0-3 whatever CUDA_VISIBLE_DEVICES says.
MACHINE_UUIDS = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd"]


def fake_nvml(util=(40, 90), mem_mib=1234):
    calls = {"n": 0}

    class NVMLError(Exception):
        pass

    def utilization(_h):
        calls["n"] += 1
        return types.SimpleNamespace(gpu=util[calls["n"] % 2])

    def by_uuid(uuid):
        if uuid not in MACHINE_UUIDS:
            raise NVMLError(f"NVML: not found {uuid}")
        return f"h{MACHINE_UUIDS.index(uuid)}"

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 4,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=(mem_mib + int(h[1:])) * 2**20, total=80 * 2**30),
        nvmlDeviceGetPowerUsage=lambda _h: 250_000,
        nvmlDeviceGetTemperature=lambda _h, _s: 61,
    )


def fake_cuda(monkeypatch, visible=(2, 3)):
    """This process sees the machine's GPUs `visible` (CUDA_VISIBLE_DEVICES=2,3) as cuda:0, cuda:1.
    torch reports a UUID without the "GPU-" prefix."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=MACHINE_UUIDS[visible[i]][4:])
    )


def test_sampler_follows_cuda_visible_devices_by_uuid(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    fake_cuda(monkeypatch)
    sampler = GPUSampler(interval_s=0.01, indices=[1], log=lambda *a: None)
    assert sampler.available and sampler.uuids == {1: "GPU-dddd"}
    assert sampler._handles == [(1, "h3")]  # NVML's GPU 3, not NVML index 1
    assert sampler._read(1, "h3")["memory_used_mib"] == 1234 + 3
    everything = GPUSampler(log=lambda *a: None)  # default: every GPU this process sees
    assert everything._handles == [(0, "h2"), (1, "h3")]


def test_sampler_records_fake_gpu_and_writes_csv(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    fake_cuda(monkeypatch, visible=(0,))
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
    assert summary["gpus"] == {"0": "GPU-aaaa"}
    sampler.write_csv(tmp_path / "gpu.csv")
    rows = list(csv.DictReader((tmp_path / "gpu.csv").open()))
    assert list(rows[0]) == FIELDS and len(rows) == len(sampler.samples)


def test_sampler_without_nvml_says_so_once(monkeypatch):
    broken = types.SimpleNamespace(
        nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("NVML Shared Library Not Found"))
    )
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    messages = []
    sampler = GPUSampler(log=messages.append)
    sampler.start()
    assert not sampler.available and sampler.stop() == [] and sampler.summary() is None
    assert len(messages) == 1 and "skipped" in messages[0] and "NVML Shared Library Not Found" in messages[0]


def test_env_and_header():
    env = collect_env("cpu")
    assert env["torch"] == torch.__version__ and env["cpu_count"] >= 1
    header = format_header({"epochs": 3, "act": "relu"}, env, terminal=True)
    assert "torch " + torch.__version__ in header and "epochs = 3" in header.replace("  ", " ")
    in_a_log = format_header({"epochs": 3, "act": "relu"}, env, terminal=False)  # stdout is a file: one line
    assert in_a_log.splitlines()[-1] == "config: epochs=3  act=relu" and in_a_log.startswith("== trainlab")


def test_image_grid_layout_and_range():
    grid = image_grid(torch.arange(6 * 25, dtype=torch.float32).view(6, 5, 5), ncol=3, pad=1)
    assert grid.shape == (1, 2 * 6 + 1, 3 * 6 + 1)
    assert float(grid.min()) == 0.0 and float(grid.max()) == 1.0


def test_busy_snapshot_runs_nvidia_smi_in_the_background(monkeypatch, tmp_path):
    from trainlab.telemetry.env import BusySnapshot

    # The fake nvidia-smi answers only once the test lets it: if start() waited for it, start() would
    # not return until the flag exists, which is created only after start() returned (no clock involved).
    flag = tmp_path / "go"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        f"#!/bin/sh\nwhile [ ! -f {flag} ]; do sleep 0.02; done\necho '| 0  NVIDIA H100 80GB HBM3 |  97%  Default |'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/bin:/usr/bin")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    started = []
    caller = threading.Thread(target=lambda: started.append(BusySnapshot().start()), daemon=True)
    caller.start()
    caller.join(timeout=60)
    assert started, "start() waited for nvidia-smi: the GPU would sit idle meanwhile"
    flag.touch()
    result = started[0].finish()
    assert "97%" in result["text"] and result["taken_utc"]
    assert BusySnapshot().finish() is None  # never started
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert BusySnapshot().start().finish() is None  # no driver tools: nothing, no error


@pytest.mark.gpu
def test_gpu_run_records_busy_nvidia_smi_and_samples_its_own_gpu(tmp_path):
    import json
    import shutil

    from trainlab.lenet.config import TrainConfig
    from trainlab.lenet.loop import train
    from trainlab.telemetry.gpu import cuda_uuid

    run = tmp_path / "run"
    summary = train(
        TrainConfig(epochs=1, train_subset=30000, device="cuda", progress=False, out=str(run)), log=lambda *a: None
    )
    index = torch.cuda.current_device()
    assert summary["gpu"]["gpus"] == {str(index): cuda_uuid(index)}
    if shutil.which("nvidia-smi"):
        env = json.loads((run / "env.json").read_text())
        assert env["nvidia_smi"] and env["nvidia_smi_busy"]["text"] == (run / "nvidia-smi-busy.txt").read_text()


def test_the_digit_grid_draws_each_image_in_its_own_tile_under_its_caption():
    """One mosaic in one axes: each image scaled to its own range (as imshow of it alone would), found once
    in the mosaic, with its caption centred above it; the blank rest is masked (drawn white)."""
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view

    from trainlab.telemetry.figures import digit_grid_figure

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (5, 28, 28)).astype(np.uint8)
    images[3] //= 4  # a dim image still fills the gray range of its tile
    fig = digit_grid_figure(images, [f"{i}→{i + 1}" for i in range(5)], ncol=3, title="t")
    (ax,) = fig.axes
    mosaic = ax.images[0].get_array()
    windows = sliding_window_view(mosaic.filled(np.nan), (28, 28))
    captions = {t.get_text(): t.get_position() for t in ax.texts}
    assert list(captions) == [f"{i}→{i + 1}" for i in range(5)]
    for i, image in enumerate(images):
        scaled = (image - image.min()) / (image.max() - image.min())
        hits = np.argwhere(np.all(np.isclose(windows, scaled), axis=(2, 3)))
        assert len(hits) == 1, i
        (top, left), (x, y) = hits[0], captions[f"{i}→{i + 1}"]
        assert left < x < left + 28 and top - 12 < y < top  # centred over its tile, just above it
    assert mosaic.mask.sum() == mosaic.size - 5 * 28 * 28  # nothing else drawn
