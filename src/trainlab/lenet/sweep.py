"""`trainlab sweep`: train LeNet-5 over a grid of settings and seeds; statistics come from `trainlab report`.

    trainlab sweep --optimizer adam,sgd --lr 1e-3,2e-3 --seeds 3 --out runs/opt-lr

Every `trainlab train` flag takes a comma-separated list here; its flag, type, choices and help come
from `TrainConfig`'s fields (`flags.add_list_flags`), so a new training flag is sweepable the day it
is added. The grid is the product of the lists (in TrainConfig's field order) times the seeds. Each
point is a normal run directory, `OUT/<flag>=<value>_..._seed=<s>`, and `OUT/sweep.json` records the
grid, so `trainlab report OUT` groups the runs by the swept flags and shows mean ± sd over seeds and
one plot per flag.

Where the runs execute:
- one device (the CPU, or one GPU): one after another, in this process;
- several GPUs: one run per GPU at a time, each in its own process (`trainlab worker`, with
  CUDA_VISIBLE_DEVICES naming its GPU), the next queued run starting on the first GPU that frees up
  (`schedule`, a pure function of the launch/wait callbacks, so the logic is tested without GPUs).
A run directory that already holds a summary.json is kept, so the same command finishes an
interrupted sweep. Every configuration is validated before the first run starts.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from trainlab.distributed.launch import start_process, worker_command, write_spec
from trainlab.errors import ConfigError, HardwareError
from trainlab.io import atomic_write_json, read_json
from trainlab.lenet.config import MAX_RUNS, SweepConfig, TrainConfig, apply_preset
from trainlab.lenet.data_parallel import MULTI_PROCESS_MODES, check_launch
from trainlab.lenet.loop import train

SWEEP_FILE = "sweep.json"


@dataclass
class Run:
    name: str
    config: TrainConfig
    values: dict  # swept flag → value for this run (seed included)

    @property
    def dir(self) -> Path:
        return Path(self.config.out)

    @property
    def done(self) -> bool:
        """Finished, by this configuration: a folder holding another configuration's run is refused."""
        if not (self.dir / "summary.json").exists():
            return False
        saved = TrainConfig.from_dict(read_json(self.dir / "config.json"), source=str(self.dir / "config.json"))
        differ = self.config.result_differences(saved)
        if differ:
            raise ConfigError(
                f"{self.dir}: holds a finished run of other settings ("
                + ", ".join(
                    f"{k} {getattr(saved, k)!r}, this sweep wants {getattr(self.config, k)!r}" for k in differ[:3]
                )
                + "); give the sweep another --out"
            )
        return True

    def resume_from(self) -> str | None:
        """An interrupted run continues from its last checkpoint; a run dir left by a start that never
        checkpointed is the sweep's own, so it is replaced (the run dir refuses silent reuse otherwise)."""
        if (self.dir / "checkpoint.pt").exists():
            return str(self.dir)
        if self.dir.is_dir() and any(self.dir.iterdir()):
            self.config = dataclasses.replace(self.config, overwrite=True)
        return None


def _show(v: Any, exact: bool = False) -> str:
    """A value as a folder-name part: short (`:g`), or `exact` (repr: every float digit) when short
    labels of one flag collide (0.0010000001 and 0.001 are both 0.001 in `:g`)."""
    text = (
        (repr(v) if exact else f"{v:g}") if isinstance(v, float) else str(v).lower() if isinstance(v, bool) else str(v)
    )
    return "".join(c if c.isalnum() or c in ".-+" else "_" for c in text)


def _labels(values: list) -> dict:
    """value → its folder label, distinct for distinct values (or a ConfigError naming the clash)."""
    for exact in (False, True):
        labels = {v: _show(v, exact) for v in values}
        if len(set(labels.values())) == len(labels):
            return labels
    clash = [v for v in values if list(labels.values()).count(labels[v]) > 1]
    raise ConfigError(
        f"values {', '.join(map(repr, clash))} would share the run folder label {labels[clash[0]]!r}; "
        "give distinct values"
    )


def plan(values: dict[str, list], sc: SweepConfig) -> tuple[list[Run], dict[str, list], list[str], Path]:
    """The runs of the sweep: the product of the value lists (TrainConfig field order), seeds last.
    Returns (runs, every flag's values with the seeds filled in, the swept flags — those with more than
    one value — and the sweep directory)."""
    sc.validate()
    values = dict(values)
    if sc.seeds is not None:
        if "seed" in values:
            raise ConfigError("--seeds N and --seed LIST both give the seeds: use one of them")
        values["seed"] = list(range(sc.seeds))
    order = [f for f in TrainConfig.__dataclass_fields__ if f in values and f != "seed"] + (
        ["seed"] if "seed" in values else []
    )
    total = math.prod(len(values[k]) for k in order)  # counted before a single run is built
    if total > MAX_RUNS:
        raise ConfigError(
            f"the sweep has {total:,} runs ({' × '.join(str(len(values[k])) for k in order)}); "
            f"expected at most {MAX_RUNS:,}: sweep fewer values or seeds"
        )
    swept = [k for k in order if len(values[k]) > 1]
    root = Path(sc.out) if sc.out else Path("runs") / f"sweep-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    labels = {k: _labels(values[k]) for k in swept}
    runs = []
    for combo in itertools.product(*(values[k] for k in order)):
        point = dict(zip(order, combo))
        name = "_".join(f"{k}={labels[k][point[k]]}" for k in swept) or "run"
        explicit = {**point, "out": str(root / name), "name": name}
        explicit.setdefault("progress", False)  # many runs: one line per epoch, no bars
        cfg = apply_preset(TrainConfig(**explicit), explicit.get("preset", "default"), explicit=set(explicit))
        runs.append(Run(name, cfg, {k: point[k] for k in swept}))
    return runs, {k: values[k] for k in order}, swept, root


def validate(cfg: TrainConfig) -> None:
    """The checks `train` makes before loading data (`TrainConfig.validate`, the launch), made for every
    run before the first one starts; and a sweep's runs are single-process."""
    cfg.validate()
    if cfg.parallel in MULTI_PROCESS_MODES:
        raise ConfigError(
            f"--parallel {cfg.parallel}: a sweep runs single-process runs (one per device); "
            "run multi-process training with `trainlab train --nproc N`"
        )
    check_launch(cfg.parallel, 1, cfg.device, cfg.batch_size)


def resolve_gpus(spec: str, device: str) -> list[int]:
    """The GPUs to spread runs over; [] means one run after another in this process."""
    if spec in ("auto", "none"):
        gpus = None
    else:
        try:
            gpus = [int(g) for g in spec.split(",") if g.strip()]
        except ValueError:
            raise ConfigError(
                f"--gpus {spec!r}: expected auto, none or comma-separated GPU indices such as 0,1"
            ) from None
        if not gpus or len(set(gpus)) != len(gpus):
            raise ConfigError(f"--gpus {spec!r}: expected distinct GPU indices such as 0,1")
        if str(device) == "cpu":
            raise ConfigError(f"--gpus {spec} with --device cpu: GPU indices need --device cuda (or auto)")
    if spec == "none" or str(device) == "cpu":
        return []
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus is None:  # auto
        return list(range(visible)) if visible > 1 and device in ("auto", "cuda") else []
    bad = [g for g in gpus if not 0 <= g < visible]
    if bad:
        raise HardwareError(f"--gpus {spec}: GPU {bad[0]} is not visible ({visible} CUDA device(s))")
    return gpus


# ---------------------------------------------------------------------------------- scheduling


def schedule(
    jobs: list,
    gpus: list[int],
    start: Callable[[Any, int], Any],
    wait_any: Callable[[list], tuple[Any, int]],
    on_done: Callable[[Any, int, int], None] | None = None,
) -> dict[int, tuple[int, int]]:
    """Run every job with at most one job per GPU at a time, in order, each on the lowest free GPU.

    `start(job, gpu)` launches a job and returns a handle; `wait_any(handles)` blocks until one of the
    running handles finishes and returns (handle, exit code); `on_done(job, gpu, code)` hears of each
    as it finishes. Returns {job index: (gpu, exit code)}. A failed job frees its GPU like a finished
    one; the others still run.
    """
    if not gpus:
        raise ValueError("schedule needs at least one GPU")
    pending = list(enumerate(jobs))
    free = sorted(gpus)
    running: dict[Any, tuple[int, int]] = {}  # handle → (job index, gpu)
    results: dict[int, tuple[int, int]] = {}
    while pending or running:
        while pending and free:
            index, job = pending.pop(0)
            gpu = free.pop(0)
            running[start(job, gpu)] = (index, gpu)
        handle, code = wait_any(list(running))
        index, gpu = running.pop(handle)
        results[index] = (gpu, code)
        if on_done is not None:
            on_done(jobs[index], gpu, code)
        free.append(gpu)
        free.sort()
    return results


def _start_process(run: Run, gpu: int, root: Path):
    """`trainlab worker` for one run on one GPU (seen by the run as cuda:0); output to OUT/logs/."""
    resume = run.resume_from()
    cfg = TrainConfig(**{**run.config.to_dict(), "device": "cuda"})
    spec = write_spec(root / "logs" / f"{run.name}.spec.json", "train", config=cfg.to_dict(), resume=resume)
    log_file = open(root / "logs" / f"{run.name}.log", "w")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
    proc = start_process(worker_command(1, spec), stdout=log_file, stderr=subprocess.STDOUT, env=env)
    log_file.close()  # the child holds its own descriptor
    return proc


def _wait_any(procs: list, poll_s: float = 0.5) -> tuple[Any, int]:
    while True:
        for p in procs:
            code = p.poll()
            if code is not None:
                return p, code
        time.sleep(poll_s)


# ---------------------------------------------------------------------------------- the sweep


def _outcome(run: Run) -> str:
    try:
        s = read_json(run.dir / "summary.json")
        t99 = s.get("time_to_99_seconds")
        return (
            f"test accuracy {s['test_accuracy']:.2f} %, {s['train_seconds']:.1f} s, "
            f"time to 99 %: {f'{t99:.1f} s' if t99 is not None else 'not reached'}"
        )
    except Exception as e:  # the line is informative only
        return f"no summary ({type(e).__name__})"


def run_sweep(values: dict[str, list], sc: SweepConfig, command: str = "", log=print) -> int:
    """Plan, validate, record sweep.json, run what is not done yet; returns the number of failed runs."""
    runs, values, swept, root = plan(values, sc)
    for run in runs:
        validate(run.config)
    gpus = resolve_gpus(sc.gpus, runs[0].config.device)
    todo = [r for r in runs if not r.done]
    where = (
        f"one run per GPU on GPUs {','.join(map(str, gpus))}"
        if gpus
        else f"one after another on --device {runs[0].config.device}"
    )
    grid = " × ".join(f"{len(values[k])} {k}" for k in swept) or "one configuration"
    log(f"sweep: {len(runs)} runs ({grid}), {len(runs) - len(todo)} already done, {where}; directory {root}")
    for run in runs:
        log(f"  {run.name}{'  (done)' if run.done else ''}")
    if sc.dry_run:
        return 0
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        root / SWEEP_FILE,
        {
            "command": command,
            "swept": swept,
            "values": values,
            "runs": [{"name": r.name, "values": r.values} for r in runs],
        },
    )
    failed = []
    if gpus:
        (root / "logs").mkdir(exist_ok=True)

        def start(run: Run, gpu: int):
            log(f"[gpu {gpu}] start {run.name}")
            return _start_process(run, gpu, root)

        def done(run: Run, gpu: int, code: int) -> None:
            log(
                f"[gpu {gpu}] {run.name}: "
                + (_outcome(run) if code == 0 else f"FAILED (exit {code}, log {root / 'logs' / (run.name + '.log')})")
            )
            if code != 0:
                failed.append(run.name)

        schedule(todo, gpus, start, _wait_any, done)
    else:
        for i, run in enumerate(todo, 1):
            log(f"== [{i}/{len(todo)}] {run.name}")
            try:
                resume = run.resume_from()
                summary = train(
                    run.config,
                    resume=resume,
                    log=lambda line: log("   " + line) if line.startswith(("data", "epoch", "done")) else None,
                )
            except ConfigError:
                raise
            except Exception as e:  # one diverged or crashed run must not cost the rest of the sweep
                log(f"   FAILED: {type(e).__name__}: {e}")
                failed.append(run.name)
                continue
            if not summary:
                failed.append(run.name)
    finished = sum(r.done for r in runs)  # counted from the run folders, not assumed
    log(
        f"sweep done: {finished} of {len(runs)} runs finished in {root}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + f"\nreport: trainlab report {root} -o {root}/report"
    )
    return len(runs) - finished
