"""GPU telemetry: a background NVML sampler (utilization, memory, power, temperature, ~10 Hz).

This replaces the handout's nvidia-smi screenshot with a time series. Without a GPU or without the
NVML library it does nothing, and says so once.
"""

from __future__ import annotations

import csv
import io
import threading
import time

from trainlab.io import atomic_write_text

FIELDS = ["time_s", "gpu", "utilization_pct", "memory_used_mib", "memory_total_mib", "power_w", "temperature_c"]


class GPUSampler:
    """Samples every visible GPU (or the given indices) on a daemon thread until `stop()`."""

    def __init__(self, interval_s: float = 0.1, indices: list[int] | None = None, log=print):
        self.interval_s = interval_s
        self.samples: list[dict] = []
        self.available = False
        self.reason = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        try:
            import pynvml  # from nvidia-ml-py

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._nvml = pynvml
            self._handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in (indices if indices is not None else range(count))]
            self.available = bool(self._handles)
            if not self.available:
                self.reason = "NVML reports no GPU"
        except Exception as e:  # no driver / no library: a CPU machine
            self.reason = f"no NVIDIA GPU telemetry ({type(e).__name__}: {e})".strip()
        if not self.available:
            log(f"gpu telemetry: skipped — {self.reason}")

    def start(self) -> "GPUSampler":
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
        return {"samples": len(self.samples), "utilization_mean_pct": sum(utils) / len(utils),
                "utilization_max_pct": max(utils), "memory_used_max_mib": max(mems)}

    def write_csv(self, path) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(self.samples)
        atomic_write_text(path, buf.getvalue())

    def __enter__(self) -> "GPUSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
