"""What a result needs to be reproduced from its log alone: versions, hardware, nvidia-smi."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone

import torch

from trainlab import __version__
from trainlab.device import device_name


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def nvidia_smi_snapshot(timeout: float = 10.0) -> str | None:
    """The text of `nvidia-smi` (replaces the handout's screenshot), or None without a GPU driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        return subprocess.run([exe], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError):
        return None


class BusySnapshot:
    """`nvidia-smi` taken while the GPU works — the handout's "GPU utilization" screenshot. The one in
    env.json (`nvidia_smi`) is taken at start-up, when the GPU is idle; start this inside the first
    timed epoch or steps (it runs in the background, the work goes on) and `finish()` after them."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._started_utc: str | None = None

    def start(self) -> BusySnapshot:
        exe = shutil.which("nvidia-smi")
        if exe is not None and self._proc is None and torch.cuda.is_available():
            try:
                self._proc = subprocess.Popen([exe], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                self._started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
            except OSError:
                self._proc = None
        return self

    def finish(self, timeout: float = 10.0) -> dict | None:
        """{"text", "taken_utc"} or None (no GPU driver, or nvidia-smi failed)."""
        if self._proc is None:
            return None
        try:
            out, _ = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.communicate()
            return None
        finally:
            proc, self._proc = self._proc, None
        return {"text": out, "taken_utc": self._started_utc} if proc.returncode == 0 and out else None


def machine_load(timeout: float = 10.0) -> dict:
    """How busy the machine is as a timing starts: the 1-minute load average against the cores, and the
    compute processes on the GPUs other than this one (nvidia-smi). A timing taken under load says so in
    its record (`results.kinds.busy_reason`), instead of passing for a quiet machine's."""
    try:
        avg = os.getloadavg()[0]
    except (OSError, AttributeError):
        avg = None
    others = None
    exe = shutil.which("nvidia-smi")
    if exe is not None and torch.cuda.is_available():
        try:
            out = subprocess.run(
                [exe, "--query-compute-apps=pid,process_name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=timeout,
            ).stdout
            others = [
                ln.strip() for ln in out.splitlines() if ln.strip() and ln.split(",")[0].strip() != str(os.getpid())
            ]
        except (OSError, subprocess.SubprocessError):
            others = None
    return {"loadavg_1m": avg, "cpus": os.cpu_count(), "gpu_other_processes": others}


def collect_env(device: torch.device | str | None = None) -> dict:
    info = {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "trainlab": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": platform.node(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "numpy": _version("numpy"),
        "triton": _version("triton"),
        "transformers": _version("transformers"),
        "tensorboard": _version("tensorboard"),
        "cpu": device_name("cpu"),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "device": str(device) if device is not None else None,
        "nvidia_smi": nvidia_smi_snapshot() if torch.cuda.is_available() else None,
        "load": machine_load(),
    }
    return info


def format_header(config: dict, env: dict, terminal: bool | None = None) -> str:
    """The block every log starts with: versions, hardware and the resolved config. The config is a
    table on a terminal; in a log file (stdout not a terminal) it is one line, `config: k=v …`, so the
    log holds one line per epoch after a short header (the run directory's config.json has it all)."""
    terminal = sys.stdout.isatty() if terminal is None else terminal
    lines = [
        "== trainlab " + str(env.get("trainlab")) + " ==",
        f"python {env['python']}  torch {env['torch']}  cuda {env['torch_cuda']}  triton {env['triton']}",
        f"cpu: {env['cpu']} ({env['cpu_count']} cores, {env['torch_threads']} torch threads)",
        "gpus: " + (", ".join(env["gpus"]) if env["gpus"] else "none"),
        f"device: {env['device']}",
    ]
    if not terminal:
        return "\n".join(lines + ["config: " + "  ".join(f"{k}={v}" for k, v in config.items())])
    width = max((len(k) for k in config), default=0)
    lines.append("config:")
    for k, v in config.items():
        lines.append(f"  {k:<{width}} = {v}")
    return "\n".join(lines)
