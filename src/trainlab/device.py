"""Device choice, synchronization, memory statistics and the peak-FLOPs table for MFU."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch

from trainlab.errors import HardwareError

# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data sheets. MFU is
# measured throughput divided by this number, so it must be the *dense* figure.
PEAK_BF16_TFLOPS = {
    "A100": 312.0,
    "H100 SXM": 989.0,   # "H100 80GB HBM3"
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H200": 989.0,
    "L40S": 362.0,
    "A10": 125.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
    "V100": 125.0,       # fp16 tensor cores; V100 has no bf16
}


def resolve_device(name: str | None = "auto") -> torch.device:
    """`auto` → CUDA if available, else CPU. An explicit `cuda` without a GPU is a clear error."""
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise HardwareError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise HardwareError(f"--device {name}: no CUDA GPU is available on this machine (torch {torch.__version__})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise HardwareError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    elif dev.type != "cpu":
        raise HardwareError(f"--device {name}: only cpu and cuda are supported")
    return dev


def synchronize(device: torch.device | str) -> None:
    """Wait for queued GPU work. Timing without this measures launch, not execution."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def timed(device: torch.device | str, out: dict, key: str):
    """Adds the synchronized wall time of the block (seconds) to `out[key]`."""
    synchronize(device)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        synchronize(device)
        out[key] = out.get(key, 0.0) + time.perf_counter() - t0


def reset_peak_memory(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device | str) -> dict:
    """Peak allocated/reserved bytes since the last reset (CUDA); process peak RSS on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return {
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
        }
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"peak_allocated_bytes": None, "peak_reserved_bytes": None, "peak_rss_bytes": int(rss)}


def total_memory_bytes(device: torch.device | str) -> int | None:
    """The device's memory (a GPU's, or the machine's RAM for the CPU); None if unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return _cpu_model() or platform.processor() or "cpu"


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def peak_tflops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> tuple[float | None, str]:
    """(peak TFLOP/s, where the number comes from) for MFU.

    GPUs: the data-sheet dense bf16 figure, matched on the device name. CPUs have no data-sheet
    number we can trust, so the peak is *measured*: the best of a few large float32 matmuls.
    """
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
            tokens = key.split()
            if all(t in name for t in tokens):
                # "H100 80GB HBM3" is the SXM part; PCIe names say "PCIe".
                return PEAK_BF16_TFLOPS[key], f"data sheet ({key}, dense bf16)"
        if "H100" in name:
            return (PEAK_BF16_TFLOPS["H100 PCIe"] if "PCIe" in name else PEAK_BF16_TFLOPS["H100 SXM"]), "data sheet (H100, dense bf16)"
        return None, f"unknown GPU {name!r}: no peak in the table"
    return measured_cpu_matmul_tflops(), "measured float32 matmul peak on this CPU"


_CPU_PEAK: float | None = None


def measured_cpu_matmul_tflops(n: int = 1024, repeats: int = 5) -> float:
    global _CPU_PEAK
    if _CPU_PEAK is None:
        a = torch.randn(n, n)
        b = torch.randn(n, n)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        _CPU_PEAK = 2 * n**3 / best / 1e12
    return _CPU_PEAK
