"""Worker processes: start them (one way: a JSON spec under torchrun), join their process group, end them.

Starting: the parent resolves and validates its config, writes it as JSON (`write_spec`) and runs
`trainlab worker SPEC.json` once, or under torchrun in N processes (`worker_command`). No config ever
travels as a command line, so there is nothing to re-parse and no flag can be lost on the way.
Every child that runs work (a worker, torchrun, a lab step, a sweep run) starts in `start_process`: it
dies with its launcher (a parent-death signal; every `trainlab worker` arms its own too, since torch's
agent starts workers without one), and each launch gets a temp folder of its own (`launch_folder`: the
workers' $TMPDIR and the agent's logs), removed when the launch ends.

`launch_workers` (`train --nproc N`, `gpt bench --nproc N`) runs torchrun's elastic agent in this
process rather than the `torchrun` command, so a failed job ends with one line saying which rank
failed and how, instead of torchrun's 40-line traceback: each worker leaves its error line in the
agent's per-rank error file (`record_worker_error`), a rank killed by a signal is read off its exit
status, and the parent picks the root cause (`describe_failure`). Workers inherit this process's
stdout/stderr, so their progress streams as before.

A hung rank ends soon after the process-group timeout: the others fail that long after it hangs, and
the agent then stops it with SIGTERM. A *stopped* rank (SIGSTOP, a debugger) cannot act on SIGTERM,
and torch's agent waits a hard-coded 30 s before SIGKILL, so `_ResumeStoppedWorkers` sends it SIGCONT
once the agent's SIGTERM is pending: that SIGTERM then ends it at once.

Joining: `init_distributed` reads torchrun's RANK/WORLD_SIZE/LOCAL_RANK. Every process group gets a
timeout, so a dead or hung rank makes the others fail with an error naming the timeout instead of
waiting forever in a collective. Generic on purpose: the LeNet data-parallel modes and the GPT
strategies both use it.

Ending: one rule, `end_worker`, applied where `trainlab worker` dispatches (and to a rank under a
user's own torchrun, and to the tests' spawned ranks): results written atomically, a barrier with the
process-group timeout, then `os._exit` without running the process-group destructors, which can block
for good with gloo. A group with peers is therefore never destroyed (`release_group` only frees a
group of one) and objects that talk to it are kept until the end (`keep_alive`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from trainlab.device import resolve_device
from trainlab.errors import ConfigError, HardwareError
from trainlab.hardware import check_process_count
from trainlab.io import atomic_write_json, atomic_write_text, contained
from trainlab.schema import MAX_SECONDS
from trainlab.signals import LAUNCHER_ENV, stop_children_on_signal  # LAUNCHER_ENV: the workers' errors go to the agent

DEFAULT_TIMEOUT_S = 120.0  # long enough for a slow first NCCL init, short enough that a hang is noticed
TIMEOUT_ENV = "TRAINLAB_DIST_TIMEOUT_S"  # process-group timeout; set by `trainlab train --dist-timeout`
LAUNCHER_PID_ENV = "TRAINLAB_LAUNCHER_PID"  # the in-process agent's pid: its workers' parent
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # the agent's per-rank error file (torch.distributed.elastic)
SHUTDOWN_GRACE_S = 3  # after one rank fails, the others get SIGTERM and this long before SIGKILL
_group_timeout_s = DEFAULT_TIMEOUT_S  # the timeout of the group this process joined (init_distributed)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: global rank, world size, rank on this node, and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    timeout_s: float = 120.0  # the process group's collective timeout

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _pick_device(device: str | None, local_rank: int) -> torch.device:
    if device in (None, "", "auto"):
        device = resolve_device("auto").type  # one line on stderr when a GPU is there but unusable
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise HardwareError(f"--device {device}: no CUDA GPU is available on this machine")
        if local_rank >= torch.cuda.device_count():
            raise HardwareError(f"local rank {local_rank}: only {torch.cuda.device_count()} CUDA device(s) visible")
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)  # NCCL uses the current device; one GPU per rank
    return dev


def init_distributed(backend: str | None = None, timeout_s: float | None = None, device: str | None = None) -> DistInfo:
    """Join the process group described by torchrun's RANK/WORLD_SIZE/LOCAL_RANK environment.

    Without those variables (plain `python -m trainlab ...`) this is a world of one and no process
    group is created. The backend defaults to nccl on CUDA and gloo on CPU; the timeout to
    `dist_timeout_s()` ($TRAINLAB_DIST_TIMEOUT_S, else DEFAULT_TIMEOUT_S).
    """
    timeout_s = dist_timeout_s() if timeout_s is None else timeout_s
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    dev = _pick_device(device, local_rank)
    if world_size == 1 and "MASTER_ADDR" not in os.environ:
        return DistInfo(rank=0, world_size=1, local_rank=0, device=dev)
    if not dist.is_initialized():
        backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(
            backend=backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s), **kwargs
        )
        global _group_timeout_s
        _group_timeout_s = timeout_s  # the end barrier waits as long as any collective would
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev, timeout_s=timeout_s)


def ensure_process_group(info: DistInfo, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Create a one-rank process group when a strategy needs collectives but runs alone (e.g. zero3 or
    offload on one GPU): DDP, FSDP2 and DTensor all need an initialized default group."""
    if dist.is_initialized():
        return
    store = dist.HashStore()
    backend = "nccl" if info.device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, store=store, rank=0, world_size=1, timeout=timedelta(seconds=timeout_s))


def release_group() -> None:
    """Destroy a process group of one rank (created in this process for a strategy that needs one, or
    by an in-process world-of-one run), so that a later run can create its own.

    A group with peers is never destroyed: with gloo on CPU `destroy_process_group` (and the group's
    C++ destructor at interpreter exit) can block for good after the last collective, even though every
    rank reached it. Such a process ends through `end_worker` instead, which never runs them."""
    if dist.is_initialized() and dist.get_world_size() == 1:
        dist.destroy_process_group()


def keep_alive(obj) -> None:
    """Keep `obj` (a DDP model, an engine) until the process ends, when it belongs to a group with peers.

    Freeing a DDP model runs its reducer's C++ destructor, which can block on a gloo group whose peer
    has already exited (a 2-rank `gpt bench` under load sat in the return from its benchmark function,
    py-spy). A rank ends by `end_worker` (os._exit), so such objects are simply never freed."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        _KEPT.append(obj)


_KEPT: list = []


def end_worker(code: int) -> NoReturn:
    """The one way a worker process ends (`trainlab worker`, a rank under torchrun, a test's spawned rank).

    The worker has written its results (atomically) before it gets here. Then:
    1. a successful rank waits at a barrier for its peers, at most the process-group timeout, so no rank
       leaves while a peer is still in a collective with it; a peer that never arrives (hung) or is gone
       turns success into exit code 2 with one line (the launcher then stops the others). A failed rank
       skips the barrier: its peers may be stuck in a collective and would never arrive;
    2. stdout, stderr and the logging handlers are flushed;
    3. `os._exit`: no process-group destructor, no interpreter teardown, nothing that can block."""
    _test_hook_at_end()
    if code == 0 and dist.is_initialized() and dist.get_world_size() > 1:
        problem = _end_barrier(_group_timeout_s)
        if problem is not None:
            rank, world = dist.get_rank(), dist.get_world_size()
            line = (
                f"trainlab: error: rank {rank}/{world}: the results are written, but another rank did not reach "
                f"the end of the run: {problem}"
            )
            code = 2
            if not record_worker_error(line, code, peer=True):
                print(line, file=sys.stderr)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _end_barrier(timeout_s: float) -> str | None:
    """A barrier of every rank, given at most `timeout_s` (+ a margin): None once all arrived, else why not.
    It runs on a daemon thread, so a backend that does not honour its timeout cannot hold this rank."""
    failure: list[BaseException] = []

    def barrier() -> None:
        try:
            dist.barrier()
        except BaseException as e:  # reported as the reason, never raised
            failure.append(e)

    t = threading.Thread(target=barrier, name="end-barrier", daemon=True)
    t.start()
    t.join(timeout_s + 5)
    text = str(failure[0]).strip() if failure else ""
    if t.is_alive() or "timed out" in text.lower():
        return f"it did not arrive within the {timeout_s:g} s process-group timeout (--dist-timeout sets it)"
    if failure:
        return f"it is gone ({text.splitlines()[-1].strip()[:160] if text else type(failure[0]).__name__})"
    return None


TEST_END_ENV = "TRAINLAB_TEST_END"  # tests only: "RANK:hang" or "RANK:kill" — that rank stops at its end
TEST_END_MARK_ENV = "TRAINLAB_TEST_END_MARK"  # tests only: file that receives the time of that event


def _test_hook_at_end() -> None:
    """The tests' way to make one rank hang or die once its work is done (see tests/test_worker_end.py)."""
    raw = os.environ.get(TEST_END_ENV)
    if not raw:
        return
    rank, _, action = raw.partition(":")
    if rank != os.environ.get("RANK", "0"):
        return
    if os.environ.get(TEST_END_MARK_ENV):
        atomic_write_text(os.environ[TEST_END_MARK_ENV], f"{time.time()}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hang":
        threading.Event().wait()  # a futex wait that never ends, as the hung rank was seen


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
    if not 0 < value <= MAX_SECONDS:  # timedelta overflows past ~8.6e13 s
        raise ConfigError(f"${TIMEOUT_ENV}={raw!r}: expected a positive number of seconds up to {MAX_SECONDS:g}")
    return value


def describe_timeout(flag_value: float | None) -> str:
    """The process-group timeout and where it comes from, for the log header."""
    if flag_value is not None:
        return f"{flag_value:g} s (--dist-timeout)"
    if os.environ.get(TIMEOUT_ENV) is not None:
        return f"{dist_timeout_s():g} s (${TIMEOUT_ENV})"
    return f"{DEFAULT_TIMEOUT_S:g} s (default)"


def needs_launch(nproc: int) -> bool:
    """True when `nproc` processes are wanted and this process is not one of them yet."""
    return nproc > 1 and not under_torchrun()


def write_spec(path: str | os.PathLike, worker: str, **payload) -> Path:
    """The JSON a worker starts from: which worker (`cli.WORKERS`) and its resolved config."""
    return atomic_write_json(path, {"worker": worker, **payload}, private=True)


def worker_command(nproc: int, spec_path: str | os.PathLike, environ=None) -> list[str]:
    """`trainlab worker SPEC` in this Python: directly for one process, under torchrun for several
    (on every node of a multi-node SLURM job, with the rendezvous `slurm_rendezvous` reads)."""
    if nproc > 1:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *torchrun_args(nproc, environ),
            "-m",
            "trainlab",
            "worker",
            os.fspath(spec_path),
        ]
    return [sys.executable, "-m", "trainlab", "worker", os.fspath(spec_path)]


LAUNCH_TMP_PREFIX = "trainlab-launch-"  # the per-launch temp folder (`launch_folder`)


@contextlib.contextmanager
def launch_folder():
    """A temp folder for one launch, removed when it ends, whatever way it ends: the workers' $TMPDIR and
    the elastic agent's log folder (torch leaves a `torchelastic_*` folder per launch in the temp
    directory otherwise). Inductor's cache stays where it was (it lives under the temp directory too)."""
    tmp = tempfile.mkdtemp(prefix=LAUNCH_TMP_PREFIX)
    try:
        yield Path(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def child_env(tmp: Path, env: dict | None = None) -> dict:
    """The environment of a launched process: `env` (default: this one) with $TMPDIR in the launch's folder."""
    env = dict(os.environ if env is None else env)
    if (
        "TORCHINDUCTOR_CACHE_DIR" not in env and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    ):  # inductor's default, before $TMPDIR moves: compiled kernels are kept
        user = "".join(c if c.isalnum() else "_" for c in os.environ.get("USER", str(os.getuid())))
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
    env["TMPDIR"] = os.fspath(tmp)
    return env


def _prctl():
    """libc's prctl, looked up before any fork (importing in a forked child can deadlock on the import
    lock another thread held); None where there is none (not Linux)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL, prctl=None) -> None:
    """Linux: this process gets `sig` when the process that started it ends (PR_SET_PDEATHSIG), so a
    killed launcher (even by SIGKILL) leaves no worker running under pid 1. Called in a launched child
    between fork and exec (`start_process`) and by every `trainlab worker` at its start (the elastic
    agent starts workers without it). If the parent (`parent`, else $TRAINLAB_LAUNCHER_PID when set)
    is already gone, this process ends now."""
    prctl = prctl or _prctl()
    if prctl is None:  # not Linux: stop_tree at the launcher's exit is all there is
        return
    prctl(1, sig)  # 1: PR_SET_PDEATHSIG
    if parent is None and os.environ.get(LAUNCHER_PID_ENV, "").isdigit():
        parent = int(os.environ[LAUNCHER_PID_ENV])
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)  # the parent died before the signal was armed


def start_process(argv: list[str], **popen_kwargs) -> subprocess.Popen:
    """The one way trainlab starts a child process that runs work (a worker, torchrun, a lab step): it
    dies with this process (`die_with_parent`). The caller stops it with `stop_tree` on every way out."""
    parent, prctl = os.getpid(), _prctl()
    return subprocess.Popen(argv, preexec_fn=lambda: die_with_parent(parent, prctl=prctl), **popen_kwargs)


def run_limited(
    cmd: list[str], limit_s: float, env: dict | None = None, result: str | os.PathLike | None = None, **popen_kwargs
) -> tuple[int | None, float]:
    """Run `cmd` (a `worker_command`) and stop it after `limit_s` seconds, with every process under it:
    torchrun's agent and its workers, whatever state they are in. Returns (exit code, or None when
    stopped at the limit; seconds taken). SIGTERM to this process (like Ctrl-C) stops them too and ends
    this command with `RunStopped` (exit 143): a command that writes its rows as they finish keeps them,
    and no orphaned copy runs on beside a resumed call.

    `result` is the file the run writes when its results are complete. One that did not exist when the
    limit struck is removed after the stop: the SIGTERM lets a worker finish its epoch and write it, and
    a run stopped at its limit must not count as finished."""
    t0 = time.monotonic()
    with launch_folder() as tmp, stop_children_on_signal():
        proc = start_process(cmd, env=child_env(tmp, env), **popen_kwargs)
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            written = result is not None and os.path.exists(result)
            if proc.poll() is None:  # past the limit, or Ctrl-C / SIGTERM / an error here
                stop_tree(proc)
    if code is None and result is not None and not written:
        with contextlib.suppress(FileNotFoundError):
            os.remove(result)
    return code, time.monotonic() - t0


def stop_tree(proc: subprocess.Popen, grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """SIGTERM (and SIGCONT, which a stopped process needs to act on it) to `proc` and every process
    under it, then SIGKILL to any left after `grace_s`. Process by process: torchrun's agent starts each
    worker in a session of its own, so no process group holds them all."""
    pids = [proc.pid, *_descendants(proc.pid)]
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def _descendants(pid: int) -> list[int]:
    """Every process under `pid` (Linux /proc; elsewhere none are found and only `pid` is stopped)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                kids = [int(k) for k in children.read_text().split()]
                found += kids
                todo += kids
    return found


# ------------------------------------------------------------------------------ SLURM

RDZV_PORT = 29500  # the rendezvous port on the job's first node (MASTER_PORT overrides it)


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of one job meet: torchrun's c10d rendezvous on the job's first node."""

    nnodes: int
    endpoint: str  # host:port
    run_id: str


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'gpu[07-09,12],cpu1' → 'gpu07' (what `scontrol show
    hostnames | head -1` prints, without needing scontrol)."""
    import re

    m = re.match(r"([^,\[\]]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ConfigError(f"SLURM_JOB_NODELIST {nodelist!r}: no host in it")
    prefix, ranges = m.group(1), m.group(2)
    return prefix if ranges is None else prefix + ranges.split(",")[0].split("-")[0]


def slurm_rendezvous(environ=None) -> Rendezvous | None:
    """The rendezvous of a SLURM job on several nodes (one trainlab launcher per node: `srun
    --ntasks-per-node=1`), from SLURM_JOB_ID, SLURM_JOB_NUM_NODES (or SLURM_NNODES) and
    SLURM_JOB_NODELIST; None outside SLURM or on one node (then the rendezvous is this machine)."""
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env:
        return None
    raw = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    try:
        nnodes = int(raw)
    except ValueError:
        raise ConfigError(f"SLURM_JOB_NUM_NODES {raw!r}: expected a whole number of nodes") from None
    if nnodes <= 1:
        return None
    if not env.get("SLURM_JOB_NODELIST"):
        raise ConfigError("SLURM_JOB_NODELIST is not set: cannot find the job's first node for the rendezvous")
    port = env.get("MASTER_PORT") or str(RDZV_PORT)
    return Rendezvous(nnodes, f"{first_host(env['SLURM_JOB_NODELIST'])}:{port}", f"slurm-{env['SLURM_JOB_ID']}")


def torchrun_args(nproc: int, environ=None) -> list[str]:
    """torchrun's arguments for `nproc` processes on this node: `--standalone` on one machine; the
    job's nodes, its first node's rendezvous and its job id inside a multi-node SLURM job."""
    rdzv = slurm_rendezvous(environ)
    if rdzv is None:
        return ["--standalone", f"--nproc-per-node={nproc}"]
    return [
        f"--nnodes={rdzv.nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv.endpoint}",
        f"--rdzv-id={rdzv.run_id}",
    ]


def launch_config_kwargs(nproc: int, environ=None) -> dict:
    """The elastic agent's LaunchConfig (the same rendezvous as `torchrun_args`)."""
    rdzv = slurm_rendezvous(environ)
    if rdzv is None:
        return {
            "min_nodes": 1,
            "max_nodes": 1,
            "nproc_per_node": nproc,
            "run_id": f"trainlab-{uuid.uuid4()}",
            "rdzv_backend": "c10d",
            "rdzv_endpoint": "localhost:0",
        }
    return {
        "min_nodes": rdzv.nnodes,
        "max_nodes": rdzv.nnodes,
        "nproc_per_node": nproc,
        "run_id": rdzv.run_id,
        "rdzv_backend": "c10d",
        "rdzv_endpoint": rdzv.endpoint,
    }


def launch_workers(nproc: int, worker: str, **payload) -> int:
    """Run `worker` in `nproc` processes under torch's elastic agent; returns the exit code.

    On failure prints one line (see `describe_failure`) and returns that rank's code."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    check_process_count(nproc, "--nproc")  # every launch, before a process starts (GPU counts: the callers)
    with launch_folder() as tmp:
        spec = write_spec(tmp / f"{worker}.json", worker, **payload)
        args = ["-u", "-m", "trainlab", "worker", os.fspath(spec)]
        print(
            f"launching {nproc} workers (torch.distributed elastic agent): {sys.executable} {' '.join(args)}",
            flush=True,
        )
        fields = {f.name for f in dataclasses.fields(LaunchConfig)}
        grace = {"shutdown_timeout": SHUTDOWN_GRACE_S} if "shutdown_timeout" in fields else {}
        logs = {"logs_specs": DefaultLogsSpecs(log_dir=os.fspath(tmp / "agent"))} if "logs_specs" in fields else {}
        config = LaunchConfig(**launch_config_kwargs(nproc), max_restarts=0, monitor_interval=0.1, **grace, **logs)
        # LAUNCHER_ENV names the launch's folder: a worker writes its error file only inside it
        env = {
            **child_env(tmp, {}),
            LAUNCHER_ENV: os.fspath(tmp),
            LAUNCHER_PID_ENV: str(os.getpid()),
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(SHUTDOWN_GRACE_S),
        }
        if nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = "1"  # as torchrun does: N processes must not each spin N cores' threads
        try:
            with _quiet_agent(env), _ResumeStoppedWorkers():
                elastic_launch(config, sys.executable)(*args)
        except ChildFailedError as e:
            line, code = describe_failure(e.failures, nproc)
            print(line, file=sys.stderr, flush=True)
            return code
        except SignalException as e:  # Ctrl-C or SIGTERM to this process: the agent stopped the workers
            raise KeyboardInterrupt from e
        return 0


@contextlib.contextmanager
def _quiet_agent(env: dict):
    """While the agent runs: the workers' environment, no agent log lines (its failure report is
    replaced by one line), and this process's signal handlers restored afterwards."""
    saved_env = {k: os.environ.get(k) for k in env}
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    saved_disable = logging.root.manager.disable
    os.environ.update(env)
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(saved_disable)
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _ResumeStoppedWorkers(threading.Thread):
    """While the agent runs: a child (worker) that is stopped with the agent's SIGTERM pending gets
    SIGCONT, so that the SIGTERM ends it at once (see the module docstring). Only then: resumed any
    earlier, the hung rank would run again and report a failure of its own, hiding which rank hung."""

    def __init__(self, period_s: float = 0.2):
        super().__init__(name="resume-stopped-workers", daemon=True)
        self.period_s, self.done = period_s, threading.Event()

    def __enter__(self):
        if Path("/proc/self/task").is_dir():  # Linux; elsewhere the agent's own 30 s grace applies
            self.start()
        return self

    def __exit__(self, *_exc):
        self.done.set()

    def run(self) -> None:
        while not self.done.wait(self.period_s):
            for pid in _stopped_children_with_sigterm_pending():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)


def _stopped_children_with_sigterm_pending() -> list[int]:
    """This process's children that are stopped (state T) with SIGTERM pending (/proc/PID/status)."""
    found = []
    term = 1 << (signal.SIGTERM - 1)
    for children in Path("/proc/self/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for pid in map(int, children.read_text().split()):
                with contextlib.suppress(OSError, ValueError, KeyError):
                    status = dict(
                        line.split(":", 1)
                        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                        if ":" in line
                    )
                    pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
                    if status["State"].split()[0] == "T" and pending & term:
                        found.append(pid)
    return found


def record_worker_error(line: str, code: int, peer: bool = False) -> bool:
    """In a worker of `launch_workers`: leave this rank's error line for the launcher (which prints one
    line for the job) and return True. Elsewhere return False: the caller prints the line itself."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not (path and launched_here(path)):
        return False
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            path,
            {
                "message": line,
                "timestamp": int(time.time()),  # the agent never reads half of it
                "trainlab": {"line": line, "code": code, "peer": peer},
            },
            private=True,
        )
    except OSError:
        return False
    return True


def launched_here(error_file: str) -> bool:
    """Whether this process is a worker of `launch_workers` and `error_file` lies in that launch's folder:
    $TRAINLAB_LAUNCHER=1 set by hand, or an error file pointing at a user's file, writes nothing."""
    folder = os.environ.get(LAUNCHER_ENV, "")
    if not (os.path.isabs(folder) and Path(folder).name.startswith(LAUNCH_TMP_PREFIX)):
        return False
    try:
        owner = os.stat(folder).st_uid
    except OSError:
        return False
    return (
        owner == os.geteuid()
        and contained(folder, error_file)
        and os.path.realpath(error_file) != os.path.realpath(folder)
    )


def describe_failure(failures: dict, world_size: int) -> tuple[str, int]:
    """One line and an exit code for a failed job, from the agent's per-rank `ProcessFailure`s.

    The root cause, in this order: a rank's own error (its trainlab line); a rank killed by a signal or
    gone without a word (`os._exit`, a segfault); a rank that timed out waiting for the others (then the
    SIGTERM'd ranks are the ones that hung). SIGTERM'd ranks are the agent's own clean-up, not causes."""

    def record(f) -> dict:
        data = f.error_file_data.get("trainlab") if isinstance(f.error_file_data, dict) else None
        return data if isinstance(data, dict) else {}

    ranks = sorted(failures)
    own = [r for r in ranks if record(failures[r]) and not record(failures[r]).get("peer")]
    if own:
        rec = record(failures[own[0]])
        return rec["line"], int(rec.get("code", 1))
    stopped = [r for r in ranks if failures[r].exitcode == -signal.SIGTERM and not record(failures[r])]
    gone = [r for r in ranks if not record(failures[r]) and r not in stopped]
    peers = [r for r in ranks if record(failures[r]).get("peer")]
    if gone:
        r, f = gone[0], failures[gone[0]]
        how = (
            f"was killed by {f.signal_name()} (signal {-f.exitcode})"
            if f.exitcode < 0
            else f"exited with code {f.exitcode} without an error message"
        )
        hint = " — often the kernel's out-of-memory killer" if f.exitcode == -signal.SIGKILL else ""
        rest = "; the other ranks were stopped" if world_size > 1 else ""
        return f"trainlab: error: rank {r}/{world_size} {how}{hint}{rest}", 2
    if peers:
        line = record(failures[peers[0]])["line"]
        if stopped:
            line += f" [rank(s) {', '.join(map(str, stopped))} did not answer in time and were stopped]"
        return line, 2
    r = stopped[0]
    return f"trainlab: error: rank {r}/{world_size} was terminated by SIGTERM (signal {signal.SIGTERM.value})", 2
