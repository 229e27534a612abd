"""Repeated timings, taken interleaved, and their summaries: medians with spread, never a single lucky number."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence


def summarize(samples: Sequence[float]) -> dict:
    """median, spread (p10/p90, min/max, IQR) and count of `samples`."""
    xs = sorted(float(s) for s in samples)
    if not xs:
        return {"n": 0, "median": None, "p10": None, "p90": None, "min": None, "max": None, "iqr": None}
    q = lambda p: xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))]  # noqa: E731 nearest-rank
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "p10": q(0.10),
        "p90": q(0.90),
        "min": xs[0],
        "max": xs[-1],
        "iqr": q(0.75) - q(0.25),
    }


def format_spread(s: dict, scale: float = 1.0, unit: str = "") -> str:
    """'12.3 ms [11.9–13.0]' — median with p10–p90."""
    if not s or s.get("median") is None:
        return "n/a"
    return f"{s['median'] * scale:.3g}{unit} [{s['p10'] * scale:.3g}–{s['p90'] * scale:.3g}]"


def time_interleaved(
    fns: dict[str, Callable | Sequence[Callable]],
    warmup: int = 3,
    min_runs: int = 5,
    max_runs: int = 200,
    budget_s: float = 0.5,
    sync: Callable[[], None] = lambda: None,
    rounds: int | None = None,
    on_round: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict:
    """Wall time of each entry of `fns`, taken round-robin (run 1 of every entry, then run 2, …) so that
    a change in machine load hits all alike: on a shared machine that matters more than the number
    of runs. An entry is a callable, or a sequence of phases run back to back and timed apiece (a
    forward, then its backward). `sync` brackets every timed phase (a device synchronize). Runs go on
    for `rounds`, else until `min_runs` and `budget_s` per entry are spent (at most `max_runs`); warm-up
    runs are excluded. `clock` may be time.process_time: CPU time leaves out the waits for a core on a
    shared machine (single-threaded work only). Returns {name: summarize(samples)}, a list of them for a
    sequence of phases."""
    phases = {k: (list(v) if isinstance(v, (list, tuple)) else [v]) for k, v in fns.items()}
    samples: dict[str, list[list[float]]] = {k: [[] for _ in p] for k, p in phases.items()}
    for steps in phases.values():
        for _ in range(warmup):
            for step in steps:
                step()
    sync()
    start, runs = time.perf_counter(), 0
    while (
        runs < rounds
        if rounds is not None
        else runs < max_runs and (runs < min_runs or time.perf_counter() - start < budget_s * len(fns))
    ):
        for name, steps in phases.items():
            for i, step in enumerate(steps):
                sync()
                t0 = clock()
                step()
                sync()
                samples[name][i].append(clock() - t0)
        runs += 1
        if on_round:
            on_round(runs)
    return {
        k: [summarize(s) for s in v] if isinstance(fns[k], (list, tuple)) else summarize(v[0])
        for k, v in samples.items()
    }
