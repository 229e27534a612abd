"""Run a function in N fresh CPU processes joined by gloo: how the tests check every parallel strategy.

`spawn_for_test(fn, world_size, *args)` returns each rank's result, or raises `SpawnError` with the
failing rank's traceback (or after a timeout), so a broken strategy fails a test instead of hanging it.

The ranks are forked from a forkserver that imported torch once (`FORKSERVER_PRELOAD`): a fresh
interpreter per rank ("spawn") paid torch's import, ≈ 2.6 s of CPU, per rank and per run — most of the
suite's distributed tests' cost on the 2-core CI box. The server is a clean process of its own (it never
ran an OpenMP region or a thread pool, which fork does not copy safely), and each rank gets the caller's
environment and working folder at the call, as a spawned process would.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import traceback

import torch

from trainlab.distributed.launch import end_worker, init_distributed
from trainlab.io import atomic_torch_save  # whole or absent: the harness stops the other ranks when one fails

PORTS_ENV = "TRAINLAB_TEST_PORTS"  # "LO-HI": this process's own ports (tests/conftest.py, one range per xdist worker)
_next_port = 0
# Imported once by the forkserver; a module missing here is imported by each rank, as under "spawn".
# The GPT strategies' modules (DTensor, FSDP, pipelining, dynamo under them) are 2.5 s of CPU of their own.
FORKSERVER_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.functional",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "torch.distributed.pipelining",
    "trainlab.distributed.spawn",
)


def free_port() -> int:
    """A TCP port free now for a test's MASTER_PORT. Under $TRAINLAB_TEST_PORTS the next free one of that
    range, in turn: an OS-assigned port is free only until someone binds it, and the suite's parallel
    workers (pytest-xdist) would otherwise draw from the same pool and collide."""
    global _next_port
    lo, _, hi = os.environ.get(PORTS_ENV, "").partition("-")
    candidates = range(int(lo), int(hi)) if hi else range(1)
    for i in range(len(candidates)):
        port = candidates[(_next_port + i) % len(candidates)]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _next_port += i + 1
            return s.getsockname()[1]
    raise OSError(f"${PORTS_ENV}={lo}-{hi}: no free port in the range")


class SpawnError(RuntimeError):
    """A spawned rank failed (the message carries its traceback) or the run exceeded its timeout."""


def _spawn_entry(rank, fn, world_size, port, result_dir, pg_timeout_s, threads, args, environ):
    os.environ.clear()  # the forkserver's environment is the one of its start: the caller's is this call's
    os.environ.update(environ)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(threads)
    path = os.path.join(result_dir, f"rank{rank}.pt")
    try:
        info = init_distributed(backend="gloo", timeout_s=pg_timeout_s, device="cpu")
        out = fn(info, *args)
        atomic_torch_save(path, {"ok": True, "value": out})
        code = 0
    except BaseException:
        atomic_torch_save(path, {"ok": False, "error": traceback.format_exc()})
        code = 1
    end_worker(code)  # as every worker ends: the result is saved; barrier (on success); no destructors


def spawn_for_test(
    fn, world_size: int, *args, timeout_s: float = 120.0, pg_timeout_s: float = 60.0, threads: int = 1
) -> list:
    """Run ``fn(DistInfo, *args)`` in `world_size` fresh processes on CPU with gloo on a free local port.

    Returns the list of per-rank return values (they must be picklable with torch.save). Raises
    SpawnError with the failing rank's traceback if any rank fails, or after `timeout_s` seconds.
    `fn` must be importable (a module-level function).
    """
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload(list(FORKSERVER_PRELOAD))  # read when the server starts (once)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="trainlab_spawn_") as result_dir:
        ctx = mp.start_processes(
            _spawn_entry,
            args=(fn, world_size, port, result_dir, pg_timeout_s, threads, args, dict(os.environ)),
            nprocs=world_size,
            join=False,
            start_method="forkserver",
        )
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
