"""Device choice, synchronization, memory statistics and the peak-FLOPs table for MFU."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch

from trainlab.errors import ConfigError, HardwareError

# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' data sheets, keyed by the
# exact name CUDA reports (torch.cuda.get_device_name, the same as nvidia-smi's). MFU is measured
# throughput divided by this number, so it must be the *dense* figure of *this* part: an H200 NVL
# (835) is not an H200 SXM (989), an A10G is not an A10, a MIG slice is not the whole GPU. A name
# that is not listed exactly gets "unknown peak" and no MFU, never a guess. V100 is absent on
# purpose: it has no bf16 tensor cores.
PEAK_BF16_TFLOPS = {
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA H100 80GB HBM3": 989.0,  # H100 SXM5
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA H200": 989.0,  # H200 SXM
    "NVIDIA H200 NVL": 835.0,
    "NVIDIA L40S": 362.0,
    "NVIDIA A10": 125.0,
    "NVIDIA GeForce RTX 4090": 165.0,  # FP32 accumulate
    "NVIDIA GeForce RTX 3090": 71.0,  # FP32 accumulate
}


# Compute capability × 10 by the name CUDA reports, to plan for a GPU from a machine without it
# (`trainlab lab --plan --device-name ...`); a real run reads torch.cuda.get_device_capability.
# compute capabilities × 10 of the NVIDIA GPUs torch builds for (Volta … Blackwell): every --sm is one of them
KNOWN_SM = (70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)

COMPUTE_CAPABILITY = {
    "NVIDIA GeForce RTX 2080 Ti": 75,  # the course's GPU06 node
    "Tesla T4": 75,
    "Tesla V100-SXM2-32GB": 70,
    "NVIDIA A100-SXM4-40GB": 80,
    "NVIDIA A100-SXM4-80GB": 80,  # the course's GPU08 node
    "NVIDIA A100-PCIE-40GB": 80,
    "NVIDIA A100 80GB PCIe": 80,
    "NVIDIA A10": 86,
    "NVIDIA GeForce RTX 3090": 86,
    "NVIDIA GeForce RTX 4090": 89,
    "NVIDIA L40S": 89,
    "NVIDIA H100 80GB HBM3": 90,
    "NVIDIA H100 PCIe": 90,
    "NVIDIA H100 NVL": 90,
    "NVIDIA H200": 90,
    "NVIDIA H200 NVL": 90,
}


# Processes (ranks, DataLoader workers) per CPU core that a flag may ask for: past this each one only
# waits for a core and costs its memory (a rank or worker holds a copy of the model or the data).
PROCESSES_PER_CORE = 4


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def process_limit() -> int:
    return PROCESSES_PER_CORE * cpu_cores()


def check_process_count(n: int, flag: str) -> None:
    """`--nproc N` CPU ranks or `--workers N` against this machine, before anything is started."""
    if n > process_limit():
        raise HardwareError(
            f"{flag} {n}: this machine has {cpu_cores()} CPU core(s); expected at most "
            f"{process_limit()} processes ({PROCESSES_PER_CORE} per core)"
        )


# How an allocation failure reads, on the GPU and the CPU (torch's and the C++ runtime's messages).
OOM_MARKERS = (
    "out of memory",
    "OutOfMemoryError",
    "can't allocate memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "std::bad_alloc",
    "Cannot allocate memory",
)


def is_out_of_memory(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or any(m in str(e) for m in OOM_MARKERS)


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


def amp_for_sm(sm: int | None) -> str | None:
    """The 16-bit type autocast trains in on a GPU of compute capability `sm`/10: bf16 from Ampere (sm80) on;
    fp16 below (Turing's RTX 2080 Ti, sm75, has fp16 tensor cores and no bf16), with a GradScaler since
    fp16's range loses small gradients; None without a GPU."""
    if sm is None:
        return None
    return "bf16" if sm >= 80 else "fp16"


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


def peak_tflops_for_name(name: str) -> tuple[float | None, str]:
    """(dense bf16 peak, source) for a CUDA device name; exact names only (see PEAK_BF16_TFLOPS)."""
    if name in PEAK_BF16_TFLOPS:
        return PEAK_BF16_TFLOPS[name], f"data sheet ({name}, dense bf16)"
    return None, f"unknown peak: {name!r} is not in trainlab.device.PEAK_BF16_TFLOPS (exact names only), so no MFU"


def peak_tflops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16) -> tuple[float | None, str]:
    """(peak TFLOP/s, where the number comes from) for MFU.

    GPUs: the data-sheet dense bf16 figure of exactly this part, or None ("unknown peak"). CPUs have
    no data-sheet number we can trust, so the peak is *measured*: the best of a few large float32 matmuls.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return peak_tflops_for_name(torch.cuda.get_device_name(device))
    return measured_cpu_matmul_tflops(), "measured float32 matmul peak on this CPU"


TF32_MODES = ("on", "off")


def set_tf32(mode: str) -> dict:
    """`--tf32 on|off`: TF32 tensor cores for float32 matmuls (cuBLAS) and convolutions (cuDNN) on
    Ampere and newer GPUs. An fp32 baseline's speed depends on it (TF32 runs ~8x the fp32 rate), so
    runs state it. PyTorch's own defaults differ (matmul off, cuDNN on); "off" means both off.
    Returns `tf32_state()` for the run's record. No effect on CPU tensors."""
    if mode not in TF32_MODES:
        raise ConfigError(f"--tf32 {mode!r}: expected on or off")
    enabled = mode == "on"
    # The allow_tf32 switches exist in every supported torch (2.11-2.13) and are not deprecated there.
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    return tf32_state()


MATMUL_PRECISIONS = ("highest", "high", "medium")


def matmul_precision(tf32: str, precision: str | None) -> str:
    """`--matmul-precision highest|high|medium` beside `--tf32 on|off`, as torch names it
    (`torch.set_float32_matmul_precision`): highest = fp32 throughout, high = TF32 tensor cores (what
    `--tf32 on` means), medium = bf16 passes allowed too (report 000's setting). Unset: what --tf32
    says. The one combination that contradicts itself, `--tf32 on --matmul-precision highest`, is refused."""
    if precision is None:
        return "high" if tf32 == "on" else "highest"
    if precision not in MATMUL_PRECISIONS:
        raise ConfigError(f"--matmul-precision {precision!r}: expected one of {', '.join(MATMUL_PRECISIONS)}")
    if tf32 == "on" and precision == "highest":
        raise ConfigError("--matmul-precision highest: conflicts with --tf32 on (which is --matmul-precision high)")
    return precision


def set_matmul_precision(precision: str) -> dict:
    """Apply a `matmul_precision(...)` result to cuBLAS and cuDNN (anything below highest lets cuDNN's
    convolutions use TF32 too, as `--tf32 on` does); returns `tf32_state()` for the run's record."""
    setter = getattr(torch, "set_float32_matmul_precision", None)  # torch >= 1.12; not yet in api_compat's verdict
    if setter is not None:
        setter(precision)
    else:  # the older switch: TF32 or not (medium's bf16 passes need the setter)
        torch.backends.cuda.matmul.allow_tf32 = precision != "highest"
    torch.backends.cudnn.allow_tf32 = precision != "highest"
    return tf32_state()


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
