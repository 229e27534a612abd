"""Recognize what each report input is: a training run directory or one of trainlab's result JSONs.

Each kind is recognized by the keys its producer guarantees (the issues' contracts), so the report
does not break when a producer adds fields.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainlab.errors import UserError
from trainlab.io import read_json


@dataclass
class TrainingRun:
    path: Path
    summary: dict
    config: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    epochs: list[dict] = field(default_factory=list)   # metrics.jsonl records
    gpu: list[dict] = field(default_factory=list)      # gpu.csv rows

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class ResultFile:
    path: Path
    kind: str            # gelu_check | gelu_bench | dp_compare | gpt_bench | gpt_plan | gpt_compare | lenet_profile | ops_check | ops_bench
    data: Any

    @property
    def rows(self) -> list[dict]:
        d = self.data
        if isinstance(d, list):
            return d
        for key in ("rows", "strategies"):
            if isinstance(d, dict) and isinstance(d.get(key), list):
                return d[key]
        return [d] if isinstance(d, dict) else []


def _read_jsonl(path: Path) -> list[dict]:
    records = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{i}: not valid JSON ({e.msg})") from None
    return records


def _read_gpu_csv(path: Path) -> list[dict]:
    try:
        with path.open() as f:
            return [{k: (float(v) if v not in ("", "None") else None) for k, v in row.items()} for row in csv.DictReader(f)]
    except (ValueError, csv.Error) as e:
        raise UserError(f"{path}: not a trainlab gpu.csv ({e})") from None


def load_run(path: Path) -> TrainingRun:
    summary = read_json(path / "summary.json")
    if not isinstance(summary, dict) or "test_accuracy" not in summary:
        raise UserError(f"{path / 'summary.json'}: not a trainlab training summary (no test_accuracy)")
    run = TrainingRun(path=path, summary=summary)
    if (path / "config.json").exists():
        run.config = read_json(path / "config.json")
    if (path / "env.json").exists():
        run.env = read_json(path / "env.json")
    if (path / "metrics.jsonl").exists():
        run.epochs = _read_jsonl(path / "metrics.jsonl")
    if (path / "gpu.csv").exists():
        run.gpu = _read_gpu_csv(path / "gpu.csv")
    return run


def classify(data: Any) -> str | None:
    """The kind of a result JSON, from the keys its producer guarantees."""
    if isinstance(data, dict) and {"strategy", "tokens_per_s", "world_size"} <= set(data):
        return "gpt_bench"
    if isinstance(data, dict) and "params" in data and isinstance(data.get("strategies"), list):
        return "gpt_plan"
    rows = ResultFile(Path(), "", data).rows
    first = rows[0] if rows and isinstance(rows[0], dict) else {}
    if {"variant", "layer", "fwd_ms_median"} <= set(first):
        return "lenet_profile"
    if {"op", "case", "impl", "worst_ratio_to_tol"} <= set(first):
        return "ops_check"
    if {"layer", "impl", "fwd_median_s"} <= set(first):
        return "ops_bench"
    if {"impl", "fwd_max_abs_err"} <= set(first):
        return "gelu_check"
    if {"impl", "size", "median_s"} <= set(first):
        return "gelu_bench"
    if {"mode", "world_size", "epoch_seconds"} <= set(first):
        return "dp_compare"
    if {"strategy", "status"} <= set(first):
        return "gpt_compare"
    return None


def load_inputs(paths: list[str]) -> tuple[list[TrainingRun], list[ResultFile], list[str]]:
    """Runs, result files, and one-line notes about inputs that were skipped."""
    runs, results, notes = [], [], []
    for p in map(Path, paths):
        if p.is_dir():
            if (p / "summary.json").exists():
                runs.append(load_run(p))
                continue
            children = sorted(c for c in p.iterdir() if (c / "summary.json").exists())
            if children:  # a directory of runs, e.g. runs/
                runs.extend(load_run(c) for c in children)
            else:
                notes.append(f"{p}: no summary.json (unfinished run?) — skipped")
        elif p.is_file():
            data = read_json(p)
            kind = classify(data)
            if kind is None:
                notes.append(f"{p}: not a trainlab result file — skipped")
            else:
                results.append(ResultFile(p, kind, data))
        else:
            raise UserError(f"{p}: no such file or directory")
    return runs, results, notes
