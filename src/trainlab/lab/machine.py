"""What the lab runs on, or plans for: one `Hardware`, filled from this machine or from the data-sheet
table (`trainlab.hardware.GPUS`) by `--device-name`, and how a step's time scales to it.

Step estimates are calibrated on one machine each (`CALIBRATED`): the GPU ones on an H100 SXM, the CPU
ones on the 2-core development box. `Hardware.scale` turns a calibrated time into this machine's from
the table's ratio of peaks (compute-bound work) or of memory bandwidths (memory- and launch-bound work),
so a slower card gets longer estimates, and the limits (3× the estimate) follow.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from trainlab.errors import ConfigError
from trainlab.hardware import GPUS, KNOWN_SM, amp_for_sm, unknown_gpu_line

# The GPU every `full` estimate was measured on (benchmarks/results/gpu/h100/lab/results.json).
CALIBRATED = GPUS["NVIDIA H100 80GB HBM3"]


@dataclass(frozen=True)
class Hardware:
    """What the lab runs on. Everything but `kind`, `gpus` and `cpus` may come from the data-sheet table
    (`--device-name`) or be given by hand (`--sm`, `--gpu-mem`, `--peak-tflops`) to plan a GPU run from a
    machine without one."""

    kind: str  # cpu | cuda
    gpus: int = 0
    name: str = "cpu"
    peak_tflops: float | None = None  # dense 16-bit tensor-core peak per device (bf16, or fp16 below sm80)
    memory_bytes: int | None = None  # per device
    sm: int | None = None  # compute capability × 10
    cpus: int = 1
    bandwidth_gbs: float | None = None  # memory bandwidth per device (data sheet)
    fp32_tflops: float | None = None  # per device, without tensor cores (the fp32 baseline's rate)

    @property
    def device(self) -> str:
        return "cuda" if self.kind == "cuda" else "cpu"

    @property
    def gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def half(self) -> str | None:
        """The 16-bit type this GPU trains in: bf16 from sm80, fp16 (with a GradScaler) below; None on a CPU."""
        return amp_for_sm(self.sm or 90) if self.gpu else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

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


def from_table(name: str, gpus: int, cpus: int, sm=None, memory=None, peak=None) -> Hardware:
    """A GPU machine of `gpus` × `name` from the table; --sm/--gpu-mem/--peak-tflops override a row, and
    describe a GPU the table does not hold (all three needed, else one line saying so)."""
    spec = GPUS.get(name)
    if spec is None and None in (sm, memory, peak):
        raise ConfigError(unknown_gpu_line(name))
    if spec is None:
        return Hardware("cuda", gpus, name, peak, memory, sm, cpus)
    half = amp_for_sm(sm or spec.sm)
    return Hardware(
        "cuda",
        gpus,
        name,
        peak if peak is not None else spec.peak(half),
        memory if memory is not None else spec.memory_bytes,
        sm or spec.sm,
        cpus,
        spec.bandwidth_gbs,
        spec.fp32,
    )


def detect_hardware(
    device: str,
    device_name: str | None,
    gpus: int | None,
    peak_tflops: float | None,
    gpu_mem: str | None,
    plan_only: bool,
    sm: int | None = None,
) -> Hardware:
    """The machine, or — with --device-name and/or --sm, for --plan — the GPU machine being planned for."""
    import torch

    from trainlab.device import resolve_device
    from trainlab.gpt.planner import parse_bytes

    cpus = os.cpu_count() or 1
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: expected auto, cpu or cuda")
    if sm is not None and not plan_only:
        raise ConfigError("--sm: only with --plan (a run reads its GPU's compute capability)")
    mem = parse_bytes(gpu_mem) if gpu_mem else None
    if device_name is not None or sm is not None:
        if not plan_only and not torch.cuda.is_available():
            raise ConfigError("--device-name: only with --plan on a machine without a GPU (it plans for that GPU)")
        if device_name is None:  # hypothetical hardware: a compute capability, memory 80 GiB unless given
            return Hardware("cuda", gpus or 1, f"a GPU of compute capability {sm / 10:.1f}", peak_tflops,
                            mem or 80 * 2**30, sm, cpus)  # fmt: skip
        return from_table(device_name, gpus or 1, cpus, sm, mem, peak_tflops)
    use_cuda = device == "cuda" or (device == "auto" and resolve_device("auto").type == "cuda")  # says why not
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA GPU on this machine (use --device cpu, or --plan with --device-name)")
    if not use_cuda:
        return Hardware("cpu", 0, "cpu", peak_tflops, None, None, cpus)
    n = torch.cuda.device_count()
    if gpus is not None and gpus > n:
        raise ConfigError(f"--gpus {gpus}: this machine has {n} GPU(s)")
    major, minor = torch.cuda.get_device_capability(0)
    mem = mem or torch.cuda.get_device_properties(0).total_memory
    name = torch.cuda.get_device_name(0)
    if name in GPUS:
        return from_table(name, gpus or n, cpus, 10 * major + minor, mem, peak_tflops)
    return Hardware("cuda", gpus or n, name, peak_tflops, mem, 10 * major + minor, cpus)


def parse_sm(value: str | None) -> int | None:
    """--sm 75 | 80 | 90 (compute capability × 10; 7.5 and 8.0 are read as 75 and 80 too)."""
    import re

    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d{2,3})\s*|\s*(\d{1,2})\.(\d)\s*", str(value))
    sm = (int(m.group(1)) if m.group(1) else 10 * int(m.group(2)) + int(m.group(3))) if m else 0
    if sm not in KNOWN_SM:  # the one list, as `gpt plan --sm` checks it
        raise ConfigError(
            f"--sm {value!r}: expected a compute capability × 10 such as 75 (RTX 2080 Ti), 80 (A100) or 90 (H100)"
        )
    return sm
