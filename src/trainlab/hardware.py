"""The machine's facts that need no torch: the one data-sheet table of GPUs (memory, peak FLOP/s per
precision, bandwidth) that MFU and planning for a GPU from elsewhere both read, the CPU cores a flag may
ask processes of, the matmul-precision names, and the one machine type (`Machine`) that the GPT
planner and the lab both plan for. Flag parsing and planning import this module, never
torch (`trainlab X --help` stays instant: tests/test_cli.py)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from trainlab.errors import ConfigError, HardwareError

# compute capabilities × 10 of the NVIDIA GPUs torch builds for (Volta … Blackwell): every --sm is one of them
KNOWN_SM = (70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU from its vendor's data sheet: what planning for it needs without it (`--device-name`), and the
    peak that MFU divides by. Peaks are *dense* tensor-core TFLOP/s (the data sheets' sparse figures halved),
    with FP32 accumulation (what autocast runs: a GeForce card's fp16-accumulate rate is twice that and
    unused); None where the part has no such unit (no bf16 or TF32 before Ampere)."""

    name: str  # exactly as CUDA reports it (torch.cuda.get_device_name, nvidia-smi)
    sm: int  # compute capability × 10
    memory_gib: float  # the data sheet's "GB" (these parts carry 2^30-byte GiB: CUDA reports a little less)
    bf16: float | None
    fp16: float | None
    tf32: float | None
    fp32: float  # the CUDA cores' fp32 (no tensor cores)
    bandwidth_gbs: float  # memory bandwidth, GB/s (10^9 bytes)
    source: str  # the data sheet

    def peak(self, precision: str = "bf16") -> float | None:
        return {"bf16": self.bf16, "fp16": self.fp16, "tf32": self.tf32, "fp32": self.fp32}[precision]

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


_A100 = "NVIDIA A100 Tensor Core GPU data sheet (2021), dense figures"


_H100 = "NVIDIA H100 Tensor Core GPU data sheet (2023), dense figures (the sheet's are with sparsity: halved)"


_H200 = "NVIDIA H200 Tensor Core GPU data sheet (2024), dense figures (the sheet's are with sparsity: halved)"


_TURING = "NVIDIA Turing GPU architecture whitepaper (2018), appendix A, table 1 (RTX 2080 Ti reference)"


# The one table, keyed by the exact name CUDA reports. A name that is not listed exactly gets "unknown
# peak" and no MFU, never a guess: an H200 NVL (835) is not an H200 SXM (989), an A10G is not an A10, a
# MIG slice is not the whole GPU.
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("NVIDIA A100-SXM4-40GB", 80, 40, 312, 312, 156, 19.5, 1555, _A100),
        GpuSpec("NVIDIA A100-SXM4-80GB", 80, 80, 312, 312, 156, 19.5, 2039, _A100),  # the course's GPU08 node
        GpuSpec("NVIDIA A100-PCIE-40GB", 80, 40, 312, 312, 156, 19.5, 1555, _A100),
        GpuSpec("NVIDIA A100 80GB PCIe", 80, 80, 312, 312, 156, 19.5, 1935, _A100),
        GpuSpec("NVIDIA H100 80GB HBM3", 90, 80, 989, 989, 494.5, 67, 3350, _H100 + ", SXM5"),
        GpuSpec("NVIDIA H100 PCIe", 90, 80, 756, 756, 378, 51, 2000, _H100 + ", PCIe"),
        GpuSpec("NVIDIA H100 NVL", 90, 94, 835, 835, 417.5, 60, 3900, _H100 + ", NVL"),
        GpuSpec("NVIDIA H200", 90, 141, 989, 989, 494.5, 67, 4800, _H200 + ", SXM"),
        GpuSpec("NVIDIA H200 NVL", 90, 141, 835, 835, 417.5, 60, 4800, _H200 + ", NVL"),
        # the course's GPU06 node: Turing, fp16 tensor cores only (53.8 with FP32 accumulation, 107.6 with FP16)
        GpuSpec("NVIDIA GeForce RTX 2080 Ti", 75, 11, None, 53.8, None, 13.4, 616, _TURING),
        GpuSpec("Tesla T4", 75, 16, None, 65, None, 8.1, 320, "NVIDIA T4 Tensor Core GPU data sheet (2019)"),
        GpuSpec("NVIDIA L4", 89, 24, 121, 121, 60, 30.3, 300, "NVIDIA L4 Tensor Core GPU data sheet (2023), dense"),
        GpuSpec("NVIDIA L40S", 89, 48, 362, 362, 183, 91.6, 864, "NVIDIA L40S GPU data sheet (2023), dense"),
        GpuSpec("NVIDIA A10", 86, 24, 125, 125, 62.5, 31.2, 600, "NVIDIA A10 Tensor Core GPU data sheet, dense"),
        GpuSpec(
            "NVIDIA GeForce RTX 4090",
            89,
            24,
            165.2,
            165.2,
            82.6,
            82.6,
            1008,
            "NVIDIA Ada GPU architecture whitepaper (2023), appendix A, FP32 accumulate, dense",
        ),  # fmt: skip
        GpuSpec(
            "NVIDIA GeForce RTX 3090",
            86,
            24,
            71,
            71,
            35.6,
            35.6,
            936,
            "NVIDIA Ampere GA102 GPU architecture whitepaper (2021), appendix A, FP32 accumulate, dense",
        ),  # fmt: skip
        # Volta: fp16 tensor cores, no bf16 (so no MFU on the bf16 peak)
        GpuSpec("Tesla V100-SXM2-32GB", 70, 32, None, 125, None, 15.7, 900, "NVIDIA Tesla V100 data sheet (2020)"),
    )
}


def unknown_gpu_line(name: str) -> str:
    """The one line for a --device-name the table does not hold: what to pass instead."""
    return (
        f"--device-name {name!r}: not in trainlab's data-sheet table (trainlab.hardware.GPUS, exact names as "
        f"nvidia-smi prints them: {', '.join(GPUS)}); describe it instead with --sm, --gpu-mem and --peak-tflops"
    )


# The GPU every `full` lab estimate was measured on (benchmarks/results/gpu/h100/lab/results.json).
CALIBRATED = GPUS["NVIDIA H100 80GB HBM3"]


@dataclass(frozen=True)
class Machine:
    """What a run uses, or what a plan is made for: CUDA GPUs (count, compute capability × 10, cuDNN, one
    GPU's memory) and the facts the lab plans with (name, peaks, bandwidth, CPU cores). `detect()` reads
    this process's machine; the lab fills one from the data-sheet table (`lab.machine.from_table`), and
    the planner and tests describe one by hand. Fields nobody knows stay None."""

    gpus: int = 0  # CUDA GPUs (0: a CPU machine)
    sm: int | None = None  # compute capability × 10
    cudnn_version: int | None = None
    memory_bytes: int | None = None  # one GPU's memory (CUDA) or the host's (no GPU): --micro-batch-auto's budget
    name: str = "cpu"
    peak_tflops: float | None = None  # dense 16-bit tensor-core peak per device (bf16, or fp16 below sm80)
    cpus: int = 1
    bandwidth_gbs: float | None = None  # memory bandwidth per device (data sheet)
    fp32_tflops: float | None = None  # per device, without tensor cores (the fp32 baseline's rate)

    @classmethod
    def detect(cls) -> Machine:
        import torch  # here only: planning for a described machine imports no torch

        if not torch.cuda.is_available():
            try:
                host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            except (ValueError, OSError, AttributeError):
                host = None
            return cls(memory_bytes=host)
        major, minor = torch.cuda.get_device_capability(0)
        return cls(
            torch.cuda.device_count(),
            10 * major + minor,
            torch.backends.cudnn.version(),
            torch.cuda.get_device_properties(0).total_memory,
        )

    @property
    def kind(self) -> str:
        return "cuda" if self.gpus else "cpu"

    @property
    def device(self) -> str:
        return self.kind

    @property
    def gpu(self) -> bool:
        return self.gpus > 0

    @property
    def half(self) -> str | None:
        """The 16-bit type this GPU trains in: bf16 from sm80, fp16 (with a GradScaler) below; None on a CPU."""
        return amp_for_sm(self.sm or 90) if self.gpu else None

    def to_dict(self) -> dict:
        return {"kind": self.kind, **dataclasses.asdict(self)}

    def scale(self, seconds: float, bound: str = "compute") -> float:
        """`seconds` measured on `CALIBRATED` (a GPU step), on this machine: × the ratio of 16-bit peaks
        (`compute`), of fp32 rates (`fp32`) or of memory bandwidths (`memory`); unchanged where the table
        has no number (a CPU, a GPU given by hand) or the machine is faster (an estimate never shrinks
        below what was measured: a budget must not start what cannot finish)."""
        ours, theirs = {
            "compute": (self.peak_tflops, CALIBRATED.bf16),
            "fp32": (self.fp32_tflops, CALIBRATED.fp32),
            "memory": (self.bandwidth_gbs, CALIBRATED.bandwidth_gbs),
        }[bound]
        return seconds * max(1.0, theirs / ours) if self.gpu and ours else seconds


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


def amp_for_sm(sm: int | None) -> str | None:
    """The 16-bit type autocast trains in on a GPU of compute capability `sm`/10: bf16 from Ampere (sm80) on;
    fp16 below (Turing's RTX 2080 Ti, sm75, has fp16 tensor cores and no bf16), with a GradScaler since
    fp16's range loses small gradients; None without a GPU."""
    if sm is None:
        return None
    return "bf16" if sm >= 80 else "fp16"


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX: oneDNN's own check). Without such
    units bf16 autocast converts around fp32 arithmetic: LeNet's `fast` step took 3.7x as long as in fp32
    on an AVX2-only AMD EPYC (benchmarks/results/lenet_cpu_step_fp32.md)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def peak_tflops_for_name(name: str, precision: str = "bf16") -> tuple[float | None, str]:
    """(dense peak of `precision`, source) for a CUDA device name; exact names only (see GPUS)."""
    spec = GPUS.get(name)
    if spec is None:
        return None, f"unknown peak: {name!r} is not in trainlab.hardware.GPUS (exact names only), so no MFU"
    if spec.peak(precision) is None:
        return None, f"unknown peak: {name} has no dense {precision} tensor-core rate, so no MFU"
    return spec.peak(precision), f"data sheet ({name}, dense {precision})"


TF32_MODES = ("on", "off")


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
