"""Every rank's GPU record, on CPU: 2 gloo ranks with a fake NVML each write gpu.rank<N>.csv of their
own device, rank 0 logs one TensorBoard tag per rank and device, and the report draws both GPUs on
one timeline. nn.DataParallel's single process records every visible device."""

from __future__ import annotations

import csv
import json
import sys
import time
import types

import pytest
import torch
from test_telemetry import MACHINE_UUIDS, fake_cuda, fake_nvml

from trainlab.distributed.spawn import spawn_for_test
from trainlab.telemetry.gpu import GPUSampler, gather_samples, log_gpu_tags, rank_csv_name, sampled_devices


class TagWriter:
    def __init__(self):
        self.tags: dict[str, list] = {}

    def add_scalar(self, tag, value, step):
        self.tags.setdefault(tag, []).append((step, value))


def _sample(sampler, n=4):
    with sampler:
        deadline = time.time() + 10
        while len(sampler.samples) < n and time.time() < deadline:
            time.sleep(0.01)


def _rank_job(info, tmp):
    # this rank's process sees both GPUs (as torchrun leaves them) and drives cuda:<rank>
    sys.modules["pynvml"] = fake_nvml()
    torch.cuda.device_count = lambda: 2
    torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(uuid=MACHINE_UUIDS[i][4:])
    indices = sampled_devices("ddp", torch.device("cuda", info.rank))
    sampler = GPUSampler(interval_s=0.01, indices=indices, log=lambda *a: None)
    _sample(sampler)
    sampler.write_csv(f"{tmp}/{rank_csv_name(info.rank)}")
    per_rank = gather_samples(sampler.samples, multi_process=True)
    writer = TagWriter() if info.rank == 0 else None
    if writer is not None:
        log_gpu_tags(writer, per_rank)
    return {"indices": indices, "tags": sorted(writer.tags) if writer else None, "ranks_seen": len(per_rank)}


@pytest.mark.dist
def test_two_ranks_each_record_their_gpu_and_the_report_draws_both(tmp_path):
    ranks = spawn_for_test(_rank_job, 2, str(tmp_path), timeout_s=120)
    assert [r["indices"] for r in ranks] == [[0], [1]] and ranks[1]["tags"] is None
    assert ranks[0]["ranks_seen"] == 2
    assert ranks[0]["tags"] == [
        "gpu/rank0/cuda0/memory_used_mib",
        "gpu/rank0/cuda0/utilization",
        "gpu/rank1/cuda1/memory_used_mib",
        "gpu/rank1/cuda1/utilization",
    ]
    for rank in (0, 1):
        rows = list(csv.DictReader((tmp_path / rank_csv_name(rank)).open()))
        assert len(rows) >= 4 and {r["gpu"] for r in rows} == {str(rank)}
        assert {float(r["memory_used_mib"]) for r in rows} == {1234.0 + rank}  # NVML handle h<rank>: its own GPU

    from trainlab.report import plots
    from trainlab.report.inputs import load_run

    (tmp_path / "summary.json").write_text(json.dumps({"test_accuracy": 91.0}))
    run = load_run(tmp_path)
    assert {(r["rank"], r["gpu"]) for r in run.gpu} == {(0, 0.0), (1, 1.0)}
    png = plots.gpu_timeline(run, tmp_path / "timeline.png")
    assert png.stat().st_size > 5000


def test_data_parallel_process_records_every_visible_gpu(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    fake_cuda(monkeypatch, visible=(2, 3))
    sampler = GPUSampler(interval_s=0.01, indices=sampled_devices("dp", torch.device("cuda", 0)), log=lambda *a: None)
    _sample(sampler, n=6)
    assert {s["gpu"] for s in sampler.samples} == {0, 1}
    writer = TagWriter()
    log_gpu_tags(writer, gather_samples(sampler.samples, multi_process=False))
    assert sorted(writer.tags) == [
        "gpu/rank0/cuda0/memory_used_mib",
        "gpu/rank0/cuda0/utilization",
        "gpu/rank0/cuda1/memory_used_mib",
        "gpu/rank0/cuda1/utilization",
    ]
    # each device's own step counter: a device's curve has no gaps where the other was sampled
    assert [s for s, _ in writer.tags["gpu/rank0/cuda1/utilization"]] == list(
        range(len(writer.tags["gpu/rank0/cuda1/utilization"]))
    )
