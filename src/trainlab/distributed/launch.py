"""Worker processes: start them (one way: a JSON spec under torchrun), join their process group, end them.

Starting: the parent resolves and validates its config, writes it as JSON (`write_spec`) and runs
`trainlab worker SPEC.json` once, or under torchrun in N processes (`worker_command`). No config ever
travels as a command line, so there is nothing to re-parse and no flag can be lost on the way.

Joining: `init_distributed` reads torchrun's RANK/WORLD_SIZE/LOCAL_RANK. Every process group gets a
timeout, so a dead or hung rank makes the others fail with an error naming the timeout instead of
waiting forever in a collective. Generic on purpose: the LeNet data-parallel modes and the GPT
strategies both use it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from trainlab.errors import ConfigError, HardwareError
from trainlab.io import atomic_write_json

DEFAULT_TIMEOUT_S = 120.0  # long enough for a slow first NCCL init, short enough that a hang is noticed
TIMEOUT_ENV = "TRAINLAB_DIST_TIMEOUT_S"  # process-group timeout; set by `trainlab train --dist-timeout`


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: global rank, world size, rank on this node, and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    timeout_s: float = 120.0   # the process group's collective timeout

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _pick_device(device: str | None, local_rank: int) -> torch.device:
    if device in (None, "", "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise HardwareError(f"--device {device}: no CUDA GPU is available on this machine")
        if local_rank >= torch.cuda.device_count():
            raise HardwareError(f"local rank {local_rank}: only {torch.cuda.device_count()} CUDA device(s) visible")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)  # NCCL uses the current device; one GPU per rank
    return dev


def init_distributed(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, device: str | None = None) -> DistInfo:
    """Join the process group described by torchrun's RANK/WORLD_SIZE/LOCAL_RANK environment.

    Without those variables (plain `python -m trainlab ...`) this is a world of one and no process
    group is created. The backend defaults to nccl on CUDA and gloo on CPU.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    dev = _pick_device(device, local_rank)
    if world_size == 1 and "MASTER_ADDR" not in os.environ:
        return DistInfo(rank=0, world_size=1, local_rank=0, device=dev)
    if not dist.is_initialized():
        backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s), **kwargs)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, timeout_s=timeout_s)


def ensure_process_group(info: DistInfo, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Create a one-rank process group when a strategy needs collectives but runs alone (e.g. zero3 or
    offload on one GPU): DDP, FSDP2 and DTensor all need an initialized default group."""
    if dist.is_initialized():
        return
    store = dist.HashStore()
    backend = "nccl" if info.device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, store=store, rank=0, world_size=1, timeout=timedelta(seconds=timeout_s))


def destroy_distributed(timeout_s: float = 10.0) -> None:
    """Tear the process group down, but never wait on it for more than `timeout_s`.

    With gloo on CPU (torch 2.13) `destroy_process_group` occasionally blocks forever after the last
    collective even though every rank reached it (seen about once in four 2-rank `gpt bench` runs).
    The results are written by then, so a stuck teardown must not hold the process: it runs on a
    daemon thread and is abandoned after the timeout.
    """
    if not dist.is_initialized():
        return
    import threading

    t = threading.Thread(target=dist.destroy_process_group, name="destroy-process-group", daemon=True)
    t.start()
    t.join(timeout_s)


def exit_worker(code: int) -> None:
    """End a torchrun worker now: flush, then `os._exit`, skipping interpreter teardown, whose C++
    destructors of a half-destroyed gloo group can block (see destroy_distributed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def dist_timeout_s() -> float:
    """The process-group timeout: $TRAINLAB_DIST_TIMEOUT_S, else DEFAULT_TIMEOUT_S."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"${TIMEOUT_ENV}={raw!r}: expected a number of seconds") from None
    if value <= 0:
        raise ConfigError(f"--dist-timeout {value:g}: expected a positive number of seconds")
    return value


def needs_launch(nproc: int) -> bool:
    """True when `nproc` processes are wanted and this process is not one of them yet."""
    return nproc > 1 and not under_torchrun()


def write_spec(path: str | os.PathLike, worker: str, **payload) -> Path:
    """The JSON a worker starts from: which worker (`cli.WORKERS`) and its resolved config."""
    return atomic_write_json(path, {"worker": worker, **payload})


def worker_command(nproc: int, spec_path: str | os.PathLike) -> list[str]:
    """`trainlab worker SPEC` in this Python: directly for one process, under torchrun for several."""
    if nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                "-m", "trainlab", "worker", os.fspath(spec_path)]
    return [sys.executable, "-m", "trainlab", "worker", os.fspath(spec_path)]


def launch_workers(nproc: int, worker: str, **payload) -> int:
    """Run `worker` in `nproc` processes under torchrun from a temporary spec; returns the exit code."""
    with tempfile.TemporaryDirectory(prefix="trainlab_spec_") as tmp:
        spec = write_spec(Path(tmp) / f"{worker}.json", worker, **payload)
        cmd = worker_command(nproc, spec)
        print("launching: " + " ".join(cmd), flush=True)
        return subprocess.call(cmd)
