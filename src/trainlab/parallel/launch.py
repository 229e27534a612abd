"""Process-group start-up for torchrun workers, relaunch under torchrun, and a spawn helper for tests.

Generic on purpose: the GPT engine and the LeNet data-parallel comparison both use it.
Every process group gets a timeout so that a dead or hung rank makes the others fail with an
error naming the timeout instead of waiting forever in a collective.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from trainlab.errors import HardwareError

DEFAULT_TIMEOUT_S = 120.0  # long enough for a slow first NCCL init, short enough that a hang is noticed


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


_PEER_FAILURE_MARKERS = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe",
                         "nccl communicator was aborted", "watchdog")


def raise_if_peer_failure(exc: BaseException, info: DistInfo) -> None:
    """Turn a collective that failed because another rank died or stalled into one clear line.

    gloo reports "Timed out waiting Nms for recv" or "Connection closed by peer", NCCL's watchdog
    "Watchdog caught collective operation timeout"; either way the cause is usually on another
    rank, whose own log holds the real error.
    """
    text = str(exc)
    if isinstance(exc, dist.DistError) or any(m in text.lower() for m in _PEER_FAILURE_MARKERS):
        first = text.strip().splitlines()[-1][:200] if text.strip() else type(exc).__name__
        raise HardwareError(
            f"rank {info.rank}/{info.world_size}: a collective failed: another rank died or stalled longer than "
            f"the {info.timeout_s:.0f} s process-group timeout (see that rank's log): {first}"
        ) from exc


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


def relaunch_with_torchrun(nproc: int, argv: list[str]) -> int | None:
    """If more than one process is wanted and we are not a torchrun worker yet, run
    ``python -m torch.distributed.run --standalone --nproc-per-node N -m trainlab *argv`` and return
    its exit code. Returns None when the caller should just go on (nproc 1, or already a worker)."""
    if nproc <= 1 or under_torchrun():
        return None
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "trainlab", *argv]
    print("launching: " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


# --------------------------------------------------------------------------------------------
# Test helper


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SpawnError(RuntimeError):
    """A spawned rank failed (the message carries its traceback) or the run exceeded its timeout."""


def _spawn_entry(rank, fn, world_size, port, result_dir, pg_timeout_s, threads, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(threads)
    path = os.path.join(result_dir, f"rank{rank}.pt")
    try:
        info = init_distributed(backend="gloo", timeout_s=pg_timeout_s, device="cpu")
        out = fn(info, *args)
        torch.save({"ok": True, "value": out}, path)
    except BaseException:
        torch.save({"ok": False, "error": traceback.format_exc()}, path)
        raise
    finally:
        # Waiting for peers at the end would hang on a dead rank: destroy without a barrier.
        destroy_distributed()


def spawn_for_test(fn, world_size: int, *args, timeout_s: float = 120.0, pg_timeout_s: float = 60.0,
                   threads: int = 1) -> list:
    """Run ``fn(DistInfo, *args)`` in `world_size` fresh processes on CPU with gloo on a free local port.

    Returns the list of per-rank return values (they must be picklable with torch.save). Raises
    SpawnError with the failing rank's traceback if any rank fails, or after `timeout_s` seconds.
    `fn` must be importable (a module-level function).
    """
    import torch.multiprocessing as mp

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="trainlab_spawn_") as result_dir:
        ctx = mp.start_processes(_spawn_entry, args=(fn, world_size, port, result_dir, pg_timeout_s, threads, args),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        failure = None
        try:
            while not ctx.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise SpawnError(f"spawned run of {world_size} ranks exceeded {timeout_s:.0f} s")
        except mp.ProcessRaisedException as e:
            failure = e
        except mp.ProcessExitedException as e:
            failure = e
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes:
                p.join(5)
        records = []
        for rank in range(world_size):
            path = os.path.join(result_dir, f"rank{rank}.pt")
            records.append(torch.load(path, weights_only=False) if os.path.exists(path) else None)
        # Report a rank that raised before ranks that were merely terminated because of it.
        for rank, rec in enumerate(records):
            if rec is not None and not rec["ok"]:
                raise SpawnError(f"rank {rank} failed:\n{rec['error']}")
        for rank, rec in enumerate(records):
            if rec is None:
                raise SpawnError(f"rank {rank} left no result ({failure})")
        if failure is not None:
            raise SpawnError(str(failure))
        results = [rec["value"] for rec in records]
        return results
