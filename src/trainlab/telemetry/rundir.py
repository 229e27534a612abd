"""The run directory: everything a run produced, each file written atomically.

runs/<name>/ config.json  env.json  metrics.jsonl  events.out.tfevents.*  checkpoint.pt  summary.json  gpu.csv
             nvidia-smi-busy.txt (on a GPU: nvidia-smi taken during the first timed epoch/steps)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainlab.io import atomic_write_json, atomic_write_text, read_json


class RunDir:
    def __init__(self, path: str | Path, create: bool = True):
        self.path = Path(path)
        if create:  # non-main ranks of a data-parallel run never write here
            self.path.mkdir(parents=True, exist_ok=True)

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def checkpoint(self) -> Path:
        return self.path / "checkpoint.pt"

    def write_text(self, name: str, text: str) -> Path:
        return atomic_write_text(self.path / name, text)

    def write_json(self, name: str, obj: Any) -> Path:
        return atomic_write_json(self.path / name, obj)

    def read_json(self, name: str) -> Any:
        return read_json(self.path / name)

    def write_metrics(self, records: list[dict]) -> Path:
        """Rewrites metrics.jsonl whole, atomically: a resumed run never holds records past its checkpoint."""
        return atomic_write_text(self.path / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records))

    def append_metric(self, record: dict) -> None:
        """One more metrics.jsonl line, for runs that log per step (a lost tail costs only those steps)."""
        with open(self.path / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")

    def read_metrics(self) -> list[dict]:
        p = self.path / "metrics.jsonl"
        if not p.exists():
            return []
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
