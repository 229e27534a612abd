"""Group training runs by what differs between them (a sweep's flags) and summarize each group over seeds.

Which settings were swept is read from the runs themselves: the config keys whose values differ
across the runs, minus the seed (seeds are what a group's statistics run over) and the bookkeeping keys
that cannot change a result. A sweep directory's `sweep.json` (written by `trainlab sweep`) gives the
order in which the user listed the flags; without one, config order is used. So the same grouping
serves `trainlab sweep` output, a folder of hand-made runs, and runs passed one by one.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from trainlab.errors import UserError
from trainlab.io import read_json
from trainlab.schema import STR, ListOf, Obj

# Config keys that never change what a run computes: never a reason to put runs in different groups.
BOOKKEEPING = {
    "out",
    "name",
    "progress",
    "tensorboard",
    "gpu_telemetry",
    "stop_after",
    "dist_timeout",
    "step_timing",
    "data_dir",
    "seed",
}
SWEEP_FILE = "sweep.json"


@dataclass
class Group:
    values: dict  # swept key → value shared by the members
    members: list = field(default_factory=list)  # TrainingRun

    @property
    def label(self) -> str:
        return " ".join(f"{k}={_show(v)}" for k, v in self.values.items()) or "all runs"

    def stat(self, key: str) -> list[float]:
        return [m.summary[key] for m in self.members if isinstance(m.summary.get(key), (int, float))]

    def mean_sd(self, key: str) -> tuple[float | None, float | None]:
        xs = self.stat(key)
        if not xs:
            return None, None
        return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else None

    @property
    def seeds(self) -> list:
        return [m.summary.get("seed", m.config.get("seed")) for m in self.members]


def _show(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _config(run) -> dict:
    return run.config or {}


def swept_keys(runs: list) -> list[str]:
    """Config keys whose values differ across `runs` (seed and bookkeeping excluded), in the order a
    sweep.json lists them, else in config order."""
    keys: list[str] = []
    for run in runs:
        keys += [k for k in _config(run) if k not in keys]
    varying = [
        k
        for k in keys
        if k not in BOOKKEEPING and len({json.dumps(_config(r).get(k), sort_keys=True) for r in runs}) > 1
    ]
    order = sweep_order(runs)
    return [k for k in order if k in varying] + [k for k in varying if k not in order]


def sweep_order(runs: list) -> list[str]:
    """The flags a `trainlab sweep` listed, from the sweep.json beside its runs (empty without one)."""
    order: list[str] = []
    for parent in dict.fromkeys(Path(r.path).parent for r in runs):
        f = parent / SWEEP_FILE
        try:  # the one reader: a FIFO, a huge or deeply nested sweep.json is refused, never waited on
            data = read_json(f, Obj({"swept": ListOf(STR, max_len=1000)})) if f.exists() or f.is_symlink() else {}
        except (OSError, UserError):
            continue  # a damaged sweep.json costs the order only; the grouping comes from the configs
        for k in data.get("swept", []):
            if k not in order:
                order.append(k)
    return order


def group_runs(runs: list, keys: list[str] | None = None) -> tuple[list[str], list[Group]]:
    """(swept keys, groups of runs sharing their values), groups in first-seen order."""
    keys = swept_keys(runs) if keys is None else keys
    groups: dict[str, Group] = {}
    for run in runs:
        values = {k: _config(run).get(k) for k in keys}
        ident = json.dumps(values, sort_keys=True)
        groups.setdefault(ident, Group(values)).members.append(run)
    return keys, list(groups.values())


def series_for(key: str, keys: list[str], groups: list[Group], metric: str = "test_accuracy"):
    """For a plot of `metric` against the swept `key`: one series per combination of the other swept
    keys, each a list of (value of key, mean, sd, n) sorted by value."""
    series: dict[str, list] = {}
    for g in groups:
        others = " ".join(f"{k}={_show(g.values[k])}" for k in keys if k != key) or metric.replace("_", " ")
        mean, sd = g.mean_sd(metric)
        if mean is not None:
            series.setdefault(others, []).append((g.values[key], mean, sd or 0.0, len(g.stat(metric))))
    for points in series.values():
        points.sort(
            key=lambda p: (not isinstance(p[0], (int, float)), p[0] if isinstance(p[0], (int, float)) else str(p[0]))
        )
    return series
