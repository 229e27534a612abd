"""Device choice, synchronization, memory statistics and the matmul-precision switches: what needs torch.
The machine's facts that need none (the GPUs' data sheets, CPU cores) are `trainlab.hardware`."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch

from trainlab.errors import ConfigError, HardwareError
from trainlab.hardware import TF32_MODES, cpu_model, peak_tflops_for_name


def free_memory(device: torch.device) -> int | None:
    """Bytes a new allocation can get on `device` now: the GPU's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


_SAID_UNUSABLE = False


def gpu_unusable_reason() -> str | None:
    """Why this machine's NVIDIA GPU cannot be used from this torch, or None (no GPU, or it works).

    A GPU is "present" when the NVIDIA kernel driver is loaded (trainlab.cuda_driver.driver_version)."""
    if torch.cuda.is_available():
        return None
    from trainlab import cuda_driver

    driver = cuda_driver.driver_version()
    if driver is None:
        return None
    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU-only build on a machine with NVIDIA driver {driver}: "
            "install a CUDA build (docs/install.md)"
        )
    problem = cuda_driver.driver_problem(torch.version.cuda, driver)
    if problem:
        return problem
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    return (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot initialise CUDA with driver {driver}: "
        "see `nvidia-smi` and torch's warning above"
    )


def resolve_device(name: str | None = "auto") -> torch.device:
    """`auto` → CUDA if available, else CPU — saying in one line (stderr) why, when a GPU is present but
    unusable (driver too old for this torch, a CPU-only torch, ...). An explicit `cuda` without a GPU is
    a clear error."""
    if name in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        reason = gpu_unusable_reason()
        global _SAID_UNUSABLE
        if reason and not _SAID_UNUSABLE and os.environ.get("RANK", "0") == "0":  # once, by one rank
            import sys

            _SAID_UNUSABLE = True
            print(f"trainlab: --device auto: the GPU is not usable, running on the CPU: {reason}", file=sys.stderr)
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise HardwareError(f"--device {name!r}: expected auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise HardwareError(
                f"--device {name}: no CUDA GPU is available on this machine (torch {torch.__version__})"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise HardwareError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) visible")
    elif dev.type != "cpu":
        raise HardwareError(f"--device {name}: only cpu and cuda are supported")
    return dev


def cuda_sm(device: torch.device | str | int | None = None) -> int | None:
    """Compute capability × 10 of a CUDA device (75 RTX 2080 Ti, 80 A100, 90 H100); None without one."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


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

    return cpu_model() or platform.processor() or "cpu"


def peak_tflops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> tuple[float | None, str]:
    """(peak TFLOP/s, where the number comes from) for MFU.

    GPUs: the data-sheet dense bf16 figure of exactly this part, or None ("unknown peak"). CPUs have
    no data-sheet number we can trust, so the peak is *measured*: the best of a few large float32 matmuls.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return peak_tflops_for_name(torch.cuda.get_device_name(device))
    return measured_cpu_matmul_tflops(), "measured float32 matmul peak on this CPU"


def set_tf32(mode: str) -> dict:
    """`--tf32 on|off`: TF32 tensor cores for float32 matmuls (cuBLAS) and convolutions (cuDNN) on
    Ampere and newer GPUs. An fp32 baseline's speed depends on it (TF32 runs ~8x the fp32 rate), so
    runs state it. PyTorch's own defaults differ (matmul off, cuDNN on); "off" means both off.
    Returns `tf32_state()` for the run's record. No effect on CPU tensors."""
    if mode not in TF32_MODES:
        raise ConfigError(f"--tf32 {mode!r}: expected on or off")
    # one API for the matmul switch (torch refuses to read the precision after a mix of allow_tf32 and
    # set_float32_matmul_precision): on = high, off = highest; cuDNN's convolutions follow
    return set_matmul_precision("high" if mode == "on" else "highest")


def set_matmul_precision(precision: str) -> dict:
    """Apply a `matmul_precision(...)` result to cuBLAS and cuDNN (anything below highest lets cuDNN's
    convolutions use TF32 too, as `--tf32 on` does); returns `tf32_state()` for the run's record."""
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = precision != "highest"
    return tf32_state()


@contextmanager
def ieee_float32():
    """float32 matmuls and convolutions in IEEE float32 (TF32 off in cuBLAS and cuDNN) for the duration,
    the previous switches restored after: what a check that holds float32 to float32 tolerances needs."""
    precision, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    set_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = cudnn


def tf32_state() -> dict:
    return {
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


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
