"""What the lab runs on, or plans for: one `trainlab.hardware.Machine`, filled from this machine or from the
data-sheet table (`trainlab.hardware.GPUS`) by `--device-name`, and how a step's time scales to it.

Step estimates are calibrated on one machine each (`hardware.CALIBRATED`): the GPU ones on an H100 SXM,
the CPU ones on the 2-core development box. `Machine.scale` turns a calibrated time into this machine's from
the table's ratio of peaks (compute-bound work) or of memory bandwidths (memory- and launch-bound work),
so a slower card gets longer estimates, and the limits (3× the estimate) follow.
"""

from __future__ import annotations

import os

from trainlab.errors import ConfigError
from trainlab.hardware import GPUS, KNOWN_SM, Machine, amp_for_sm, unknown_gpu_line


def from_table(name: str, gpus: int, cpus: int, sm=None, memory=None, peak=None) -> Machine:
    """A GPU machine of `gpus` × `name` from the table; --sm/--gpu-mem/--peak-tflops override a row, and
    describe a GPU the table does not hold (all three needed, else one line saying so)."""
    spec = GPUS.get(name)
    if spec is None and None in (sm, memory, peak):
        raise ConfigError(unknown_gpu_line(name))
    if spec is None:
        return Machine(gpus, sm, memory_bytes=memory, name=name, peak_tflops=peak, cpus=cpus)
    half = amp_for_sm(sm or spec.sm)
    return Machine(
        gpus,
        sm or spec.sm,
        memory_bytes=memory if memory is not None else spec.memory_bytes,
        name=name,
        peak_tflops=peak if peak is not None else spec.peak(half),
        cpus=cpus,
        bandwidth_gbs=spec.bandwidth_gbs,
        fp32_tflops=spec.fp32,
    )


def detect_hardware(
    device: str,
    device_name: str | None,
    gpus: int | None,
    peak_tflops: float | None,
    gpu_mem: str | None,
    plan_only: bool,
    sm: int | None = None,
) -> Machine:
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
            name = f"a GPU of compute capability {sm / 10:.1f}"
            return Machine(gpus or 1, sm, memory_bytes=mem or 80 * 2**30, name=name, peak_tflops=peak_tflops, cpus=cpus)
        return from_table(device_name, gpus or 1, cpus, sm, mem, peak_tflops)
    use_cuda = device == "cuda" or (device == "auto" and resolve_device("auto").type == "cuda")  # says why not
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA GPU on this machine (use --device cpu, or --plan with --device-name)")
    if not use_cuda:
        return Machine(peak_tflops=peak_tflops, cpus=cpus)
    n = torch.cuda.device_count()
    if gpus is not None and gpus > n:
        raise ConfigError(f"--gpus {gpus}: this machine has {n} GPU(s)")
    major, minor = torch.cuda.get_device_capability(0)
    mem = mem or torch.cuda.get_device_properties(0).total_memory
    name = torch.cuda.get_device_name(0)
    if name in GPUS:
        return from_table(name, gpus or n, cpus, 10 * major + minor, mem, peak_tflops)
    return Machine(gpus or n, 10 * major + minor, memory_bytes=mem, name=name, peak_tflops=peak_tflops, cpus=cpus)


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
