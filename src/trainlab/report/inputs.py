"""Read the report's inputs: training run directories and trainlab's result JSONs.

A result names its kind (`results.kinds`: every file trainlab writes carries `kind`, `schema` and the
`plan` it ran); a JSON that names none is not a trainlab result. The values the report reads are
type-checked on the way in: a hand-edited or damaged file is one line naming the file and the key (or line), never a
traceback from a plot. An input named on the command line that cannot be used is an error; a run
found by scanning a folder (`trainlab report runs/`) that cannot be used is skipped with a note, so
one bad run never costs the whole report. A `gpt bench --out` run directory is rendered as the
benchmark result its summary.json is.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainlab.errors import UserError
from trainlab.io import check_input, read_capped, read_json, read_jsonl
from trainlab.results.kinds import SCHEMA, kind_of
from trainlab.schema import MAX_JSON_BYTES, STR, DictOf, ListOf, Obj, Opt, Spec, _is_number, check
from trainlab.telemetry.rundir import GPU_RANK_FILE


@dataclass
class TrainingRun:
    path: Path
    summary: dict
    config: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    epochs: list[dict] = field(default_factory=list)  # metrics.jsonl records
    gpu: list[dict] = field(default_factory=list)  # gpu.csv rows

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def plan(self) -> dict | None:
        """The plan record (`results.kinds.plan_record`) the run's summary carries."""
        plan = self.summary.get("plan")
        return plan if isinstance(plan, dict) else None


@dataclass
class ResultFile:
    path: Path
    kind: str  # a key of results.kinds.KINDS
    data: dict  # the stamped record

    @property
    def rows(self) -> list:
        """The record's rows (a plan's: its strategies); [] where it has none."""
        rows = self.data.get("rows", self.data.get("strategies"))
        return rows if isinstance(rows, list) else []

    @property
    def plan(self) -> dict | None:
        plan = self.data.get("plan")
        return plan if isinstance(plan, dict) else None


def identify(path: Path, data: Any) -> ResultFile | None:
    """The result a JSON is, by the kind it names; None: not a result (a training summary is a run's)."""
    kind = kind_of(data)
    if kind in (None, "lenet_train"):
        return None
    if isinstance(data.get("schema"), int) and data["schema"] > SCHEMA:
        raise UserError(f"{path}: schema {data['schema']} is newer than this trainlab reads ({SCHEMA}): upgrade it")
    return ResultFile(path, kind, data)


# The values of a training run that the report reads (`trainlab.schema`): types, and bounds a real run
# keeps — a percentage in [0, 100], any other number within ±1e15 (a hand-edited 1e308 would overflow
# every sum, axis and format), ten classes (at most MAX_CLASSES: a 100,000-entry list would take the
# plots minutes).
MAX_CLASSES = 1000
MAX_FILE_BYTES = MAX_JSON_BYTES
PERCENT = Spec("a percentage (0 to 100)", lambda v: _is_number(v) and 0 <= v <= 100)
FINITE = Spec("a number within ±1e15", lambda v: _is_number(v) and abs(v) <= 1e15)
OPT_FINITE = Opt(FINITE)
SQUARE = Spec(
    f"a square list of lists of numbers (at most {MAX_CLASSES} classes)",
    lambda v: (
        isinstance(v, list)
        and 0 < len(v) <= MAX_CLASSES
        and all(
            isinstance(r, list) and len(r) == len(v) and all(_is_number(x) and abs(x) <= 1e15 for x in r) for r in v
        )
    ),
)
SUMMARY = Obj(
    {
        "test_accuracy": PERCENT,
        "train_accuracy": Opt(PERCENT),
        "test_loss": FINITE,
        "epochs": FINITE,
        "train_seconds": FINITE,
        "seed": FINITE,
        "time_to_99_seconds": OPT_FINITE,
        "images_per_s_median": OPT_FINITE,
        "warmup_seconds": OPT_FINITE,
        "params": OPT_FINITE,
        "per_class_accuracy": ListOf(PERCENT, max_len=MAX_CLASSES),
        "confusion_matrix": SQUARE,
        "data": STR,
    },
    what="a training summary",
)
METRIC = Obj(
    {
        **{
            k: FINITE
            for k in (
                "epoch",
                "global_step",
                "train_loss",
                "test_loss",
                "images_per_s",
                "epoch_seconds",
                "lr",
                "train_seconds",
            )
        },
        "test_accuracy": PERCENT,
        "train_accuracy": Opt(PERCENT),
        "step_losses": ListOf(FINITE),
        "per_class_accuracy": ListOf(PERCENT, max_len=MAX_CLASSES),
    },
    required=("epoch", "global_step", "train_loss", "test_loss", "test_accuracy", "images_per_s", "epoch_seconds"),
)
ENV = Obj({"gpus": Opt(ListOf(STR, max_len=1024))})
GPU_COLUMNS = ("time_s", "utilization_pct", "memory_used_mib")


def _read_jsonl(path: Path) -> list[dict]:
    return read_jsonl(path, METRIC)


def _read_gpu_csv(path: Path) -> list[dict]:
    text = read_capped(path, MAX_FILE_BYTES, "a gpu.csv").decode(errors="replace")
    try:
        rows = [
            {k: (float(v) if v not in ("", "None") else None) for k, v in row.items()}
            for row in csv.DictReader(io.StringIO(text))
        ]
    except (ValueError, TypeError, csv.Error) as e:
        raise UserError(f"{path}: not a trainlab gpu.csv ({e})") from None
    missing = [c for c in GPU_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise UserError(f"{path}: not a trainlab gpu.csv (no column {', '.join(missing)})")
    return rows


def load_run(path: Path, summary: dict | None = None, inside=lambda p: True) -> TrainingRun:
    """A run directory's files; `inside(path)`: whether the report may follow a path (the lab's rule)."""
    summary = read_json(path / "summary.json") if summary is None else summary
    if not isinstance(summary, dict) or "test_accuracy" not in summary:
        raise UserError(f"{path / 'summary.json'}: not a trainlab training summary (no test_accuracy)")
    run = TrainingRun(path=path, summary=check(summary, SUMMARY, str(path / "summary.json")))
    if (path / "config.json").exists() and inside(path / "config.json"):
        run.config = read_json(path / "config.json", DictOf())
    if (path / "env.json").exists() and inside(path / "env.json"):
        run.env = read_json(path / "env.json", ENV)
    if (path / "metrics.jsonl").exists() and inside(path / "metrics.jsonl"):
        run.epochs = _read_jsonl(path / "metrics.jsonl")
    # gpu.csv: runs before per-rank records; gpu.rank<N>.csv: one per rank, tagged with the rank
    if (path / "gpu.csv").exists() and inside(path / "gpu.csv"):
        run.gpu = _read_gpu_csv(path / "gpu.csv")
    for f in sorted(path.glob("gpu.rank*.csv"), key=lambda f: (len(f.name), f.name)):
        if GPU_RANK_FILE.fullmatch(f.name) and inside(f):
            rank = int(f.name[len("gpu.rank") : -len(".csv")])
            run.gpu += [{**row, "rank": rank} for row in _read_gpu_csv(f)]
    return run


def _load_run_dir(path: Path, runs: list, results: list) -> None:
    """A training run, or another command's run directory whose summary is a result we render."""
    summary = read_json(path / "summary.json")
    if kind_of(summary) == "lenet_train":
        runs.append(load_run(path, summary))
        return
    res = identify(path / "summary.json", summary)
    if res is None:
        raise UserError(f"{path / 'summary.json'}: neither a training summary nor a trainlab result (it names no kind)")
    results.append(res)


def load_inputs(paths: list[str]) -> tuple[list[TrainingRun], list[ResultFile], list[str]]:
    """Runs, result files, and one-line notes about inputs that were skipped."""
    runs, results, notes = [], [], []
    for p in map(Path, paths):
        if p.is_dir():
            if (p / "summary.json").exists():
                _load_run_dir(p, runs, results)  # named on the command line: a problem is an error
                continue
            children = sorted(c for c in p.iterdir() if (c / "summary.json").exists())
            for c in children:  # a directory of runs, e.g. runs/: a bad one is skipped, with a note
                try:
                    _load_run_dir(c, runs, results)
                except UserError as e:
                    notes.append(f"{e} — skipped")
            if not children:
                notes.append(f"{p}: no summary.json (unfinished run?) — skipped")
        elif p.is_file():
            res = identify(p, read_json(p))
            if res is None:
                notes.append(f"{p}: not a trainlab result file — skipped")
            else:
                results.append(res)
        else:
            check_input(p)  # a FIFO or device: refused by name, never opened
            raise UserError(f"{p}: no such file or directory")
    return runs, results, notes
