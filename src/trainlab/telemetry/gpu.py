"""GPU telemetry: a background NVML sampler (utilization, memory, power, temperature, ~10 Hz).

This replaces the handout's nvidia-smi screenshot with a time series. Without a GPU or without the
NVML library it does nothing, and says so once.

Every rank samples the GPUs it uses and writes `gpu.rank<N>.csv` (nn.DataParallel: one process drives
every visible GPU, so rank 0's file holds them all); TensorBoard gets one tag per rank and device
(`gpu/rank<N>/cuda<i>/utilization`), so DataParallel's idle replicas and DDP's even load show side by side.

Which GPUs: the ones this process uses, found by UUID. NVML numbers every GPU of the machine and
ignores CUDA_VISIBLE_DEVICES (and may order them differently from CUDA), so NVML index 0 is often
not the GPU a `CUDA_VISIBLE_DEVICES=1 trainlab train` runs on. CUDA device i's UUID
(torch.cuda.get_device_properties(i).uuid) names the same physical GPU in NVML.
"""

from __future__ import annotations

import csv
import io
import threading
import time

import torch

from trainlab.io import atomic_write_text

FIELDS = ["time_s", "gpu", "utilization_pct", "memory_used_mib", "memory_total_mib", "power_w", "temperature_c"]


def cuda_uuid(index: int) -> str | None:
    """NVML's name ("GPU-…"/"MIG-…") for CUDA device `index` of this process, or None."""
    try:
        raw = str(torch.cuda.get_device_properties(index).uuid)
    except (AssertionError, RuntimeError, AttributeError):  # no CUDA, or a torch without the field
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


def nvml_handles(nvml, indices: list[int] | None = None) -> list[tuple[int, str, object]]:
    """[(CUDA index, UUID, NVML handle)] for the given CUDA devices of this process (default: all it
    can see), matched by UUID. Raises when a device cannot be matched."""
    indices = list(range(torch.cuda.device_count())) if indices is None else indices
    out = []
    for i in indices:
        uuid = cuda_uuid(i)
        if uuid is None:
            raise RuntimeError(f"CUDA device {i} has no UUID")
        out.append((i, uuid, nvml.nvmlDeviceGetHandleByUUID(uuid)))
    return out


class GPUSampler:
    """Samples the GPUs this process uses (CUDA indices `indices`, default all it can see), matched
    to NVML by UUID, on a daemon thread until `stop()`."""

    def __init__(self, interval_s: float = 0.1, indices: list[int] | None = None, log=print):
        self.interval_s = interval_s
        self.samples: list[dict] = []
        self.available = False
        self.reason = ""
        self.uuids: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        try:
            import pynvml  # from nvidia-ml-py

            pynvml.nvmlInit()
            self._nvml = pynvml
            matched = nvml_handles(pynvml, indices)
            self._handles = [(i, h) for i, _, h in matched]
            self.uuids = {i: u for i, u, _ in matched}
            self.available = bool(self._handles)
            if not self.available:
                self.reason = "no CUDA device visible to this process"
        except Exception as e:  # no driver / no library: a CPU machine
            self.reason = f"no NVIDIA GPU telemetry ({type(e).__name__}: {e})".strip()
        if not self.available:
            log(f"gpu telemetry: skipped — {self.reason}")

    def start(self) -> GPUSampler:
        if self.available and self._thread is None:
            self._t0 = time.perf_counter()
            self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def _read(self, index: int, handle) -> dict:
        nv = self._nvml
        util = nv.nvmlDeviceGetUtilizationRates(handle)
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        try:
            power = nv.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except nv.NVMLError:
            power = None
        try:
            temp = nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)
        except nv.NVMLError:
            temp = None
        return {
            "time_s": round(time.perf_counter() - self._t0, 3),
            "gpu": index,
            "utilization_pct": util.gpu,
            "memory_used_mib": mem.used / 2**20,
            "memory_total_mib": mem.total / 2**20,
            "power_w": power,
            "temperature_c": temp,
        }

    def _run(self) -> None:
        while not self._stop.is_set():
            for index, handle in self._handles:
                try:
                    self.samples.append(self._read(index, handle))
                except Exception:  # a transient NVML error must never kill training
                    pass
            self._stop.wait(self.interval_s)

    def stop(self) -> list[dict]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        return self.samples

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        utils = [s["utilization_pct"] for s in self.samples]
        mems = [s["memory_used_mib"] for s in self.samples]
        return {
            "samples": len(self.samples),
            "utilization_mean_pct": sum(utils) / len(utils),
            "utilization_max_pct": max(utils),
            "memory_used_max_mib": max(mems),
            "gpus": {str(i): u for i, u in self.uuids.items()},
        }

    def write_csv(self, path) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(self.samples)
        atomic_write_text(path, buf.getvalue())

    def __enter__(self) -> GPUSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def rank_csv_name(rank: int) -> str:
    """The file of rank `rank`'s samples in a run directory (`report` draws them on one timeline)."""
    return f"gpu.rank{rank}.csv"


def sampled_devices(mode: str, device: torch.device) -> list[int] | None:
    """The CUDA devices a rank drives: every visible one under nn.DataParallel (None), else its own."""
    if mode == "dp":
        return None
    return [device.index if device.index is not None else torch.cuda.current_device()]


def gather_samples(samples: list[dict], multi_process: bool) -> list[list[dict]]:
    """Every rank's samples in rank order (a collective: every rank calls it, after training)."""
    import torch.distributed as dist

    if not (multi_process and dist.is_initialized()):
        return [samples]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, samples)
    return everyone


def log_gpu_tags(writer, per_rank: list[list[dict]]) -> None:
    """TensorBoard: per rank and device, utilization and memory against the sample index (~10 Hz;
    the CSVs hold the exact times)."""
    for rank, samples in enumerate(per_rank):
        counts: dict[int, int] = {}
        for s in samples:
            gpu = int(s["gpu"])
            step = counts[gpu] = counts.get(gpu, -1) + 1
            writer.add_scalar(f"gpu/rank{rank}/cuda{gpu}/utilization", s["utilization_pct"], step)
            writer.add_scalar(f"gpu/rank{rank}/cuda{gpu}/memory_used_mib", s["memory_used_mib"], step)
