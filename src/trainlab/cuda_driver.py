"""Is this machine's NVIDIA driver new enough for a torch CUDA build? One line that says what to do.

Imports no torch, so `make setup` runs it as a script *before* installing a 3 GB CUDA wheel:

    python src/trainlab/cuda_driver.py              # the pinned torch 2.13.0 from PyPI: CUDA 13
    python src/trainlab/cuda_driver.py --build cu126   # PyTorch's CUDA 12.6 build (make ... TORCH_CUDA=cu126)

exits 2 with one line when the driver is too old, 0 otherwise (and on a machine without an NVIDIA GPU).
`trainlab.device` uses the same table to say why `--device auto` cannot use a GPU that is present.

The minimum drivers are NVIDIA's "minor version compatibility" floors (CUDA Compatibility guide, table
"CUDA Toolkit and Minimum Required Driver Version"): a CUDA 12.x build runs on any driver >= 525.60.13,
a 13.x build needs >= 580 (Linux). Below them `torch.cuda.is_available()` is False and torch warns once.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# CUDA major version of a torch build → the oldest Linux driver (major) that runs it
MIN_DRIVER = {11: 450, 12: 525, 13: 580}
PINNED_CUDA = "13.0"  # torch 2.13.0 from PyPI (requirements/constraints.txt) is the CUDA 13.0 build
CUDA12_BUILD = "cu126"  # a CUDA 12 build of torch 2.13 on PyTorch's own index (download.pytorch.org)
_BUILD = re.compile(r"^cu(\d{3})$")


def driver_version() -> str | None:
    """The loaded NVIDIA kernel driver's version ('580.159.04'), or None without one."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        m = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else ""
    return first if re.fullmatch(r"\d+\.\d+(\.\d+)?", first) else None


def cuda_of_build(build: str) -> str:
    """'cu126' → '12.6', 'cu130' → '13.0' (PyTorch's index names); ValueError for anything else."""
    m = _BUILD.match(build)
    if not m:
        raise ValueError(f"TORCH_CUDA={build!r}: expected a PyTorch CUDA build name such as cu126, cu128 or cu130")
    digits = m.group(1)
    return f"{digits[:-1]}.{digits[-1]}"


def required_driver(cuda: str) -> int | None:
    """The oldest driver (major version) for a CUDA runtime version such as '12.6'; None if unknown."""
    try:
        return MIN_DRIVER.get(int(str(cuda).split(".")[0]))
    except ValueError:
        return None


def driver_problem(cuda: str, driver: str | None) -> str | None:
    """Why `driver` cannot run a torch built for `cuda`, with what to do, or None when it can (or no driver)."""
    need = required_driver(cuda)
    if driver is None or need is None:
        return None
    if int(driver.split(".")[0]) >= need:
        return None
    fix = (
        f"update the NVIDIA driver, or install PyPI's CUDA 12 build: `make clean setup TORCH_CUDA={CUDA12_BUILD}` "
        f"(docs/install.md)"
        if int(str(cuda).split(".")[0]) >= 13
        else "update the NVIDIA driver (docs/install.md)"
    )
    return f"NVIDIA driver {driver} is older than {need}, which torch's CUDA {cuda} build needs: {fix}"


def main(argv: list[str]) -> int:
    build = None
    if argv[:1] == ["--build"] and len(argv) == 2:
        build = argv[1] or None
    elif argv:
        print("usage: cuda_driver.py [--build cuXYZ]", file=sys.stderr)
        return 2
    try:
        cuda = cuda_of_build(build) if build else PINNED_CUDA
    except ValueError as e:
        print(f"make: {e}", file=sys.stderr)
        return 2
    problem = driver_problem(cuda, driver_version())
    if problem:
        print(f"make: {problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
