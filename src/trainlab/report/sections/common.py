"""What every section shares: where it draws (`Ctx`), the record's facts read from its plan, the line
that says a timing was taken on a busy machine, and tables of a result's rows.

A fact is printed only from a record: `plan_facts` states the device, precision, threads, dataset
sizes and model shape a result's plan holds, and nothing it does not hold."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainlab.report import format as fmt
from trainlab.report.blocks import Block, code, para
from trainlab.results.kinds import busy_reason


@dataclass
class Ctx:
    """Where a section draws its figures and how it names files: `root` is the lab folder (paths shown
    relative to it), `reuse` redraws a figure only when its source is newer (the lab rebuilds its page
    after every step)."""

    out: Path
    index: int = 0
    reuse: bool = False
    root: Path | None = None

    def shown(self, path: Path) -> str:
        """A path as the reader should see it: relative to the lab folder, never the machine's absolute path."""
        if self.root is not None:
            try:
                return os.path.relpath(Path(path).resolve(), Path(self.root).resolve())
            except ValueError:
                pass
        return str(path)

    def figure(self, name: str, source: Path | None, draw) -> Path | None:
        return figure(self.out / name, source if self.reuse else None, draw)


def figure(path: Path, source: Path | None, draw) -> Path | None:
    """`draw(path)`, unless a `source` is given and `path` is newer than it: `trainlab lab` rebuilds
    its report after every step into its own folder, where a figure's name always stands for the same
    step output, and a finished output does not change (drawing every figure again took ~25 s per step
    on a loaded 2-core box). A one-off `trainlab report` passes no source: it always draws."""
    if source is None:
        return draw(path)
    try:
        if path.stat().st_mtime >= source.stat().st_mtime:
            return path
    except OSError:
        pass  # not drawn yet, or no source to compare with: draw
    return draw(path)


def table_from_rows(rows: list[dict], preferred: list[str]) -> list[list[str]]:
    """The preferred columns that the rows have, in that order, one table row per input row, each
    value formatted by what its key says it is."""
    keys = [k for k in preferred if any(k in r for r in rows)]
    return [[fmt.header(k) for k in keys]] + [[fmt.value(k, r.get(k)) for k in keys] for r in rows]


def model_words(model: dict | None) -> str | None:
    """'gpt2-tiny: hidden 64, 2 heads, 2 layers, sequence 64' — only the dimensions recorded."""
    if not isinstance(model, dict) or not model.get("name"):
        return None
    dims = [
        f"{word} {fmt.count(model[key])}"
        for key, word in (("hidden", "hidden"), ("heads", "heads"), ("layers", "layers"), ("seq", "sequence"))
        if fmt.is_number(model.get(key))
    ]
    return str(model["name"]) + (f": {', '.join(dims)}" if dims else "")


def dataset_words(dataset: dict | None) -> str | None:
    """'mnist, 2,048 training and 1,024 test images' — a size is stated only where the plan records it."""
    if not isinstance(dataset, dict) or not dataset.get("name"):
        return None
    unit = "tokens" if dataset.get("name") == "random tokens" else "images"
    sizes = [
        f"{fmt.count(dataset[k])} {word}"
        for k, word in (("train", "training"), ("test", "test"))
        if fmt.is_number(dataset.get(k))
    ]
    if unit == "tokens" and fmt.is_number(dataset.get("total")):
        sizes = [f"{fmt.count(dataset['total'])} tokens timed"]
    elif sizes:
        sizes[-1] += f" {unit}"
    return str(dataset["name"]) + (f", {' and '.join(sizes)}" if sizes else "")


def plan_facts(plan: dict | None) -> list[str]:
    """The facts a result's plan records, as short phrases; none that it does not record."""
    if not isinstance(plan, dict):
        return []
    facts = []
    if plan.get("device"):
        name = plan.get("device_name")
        facts.append(f"device {plan['device']}" + (f" ({name})" if name else ""))
    if plan.get("precision"):
        facts.append(f"precision {plan['precision']}")
    if fmt.is_number(plan.get("threads")):
        facts.append(f"{plan['threads']} CPU thread(s)")
    for words in (model_words(plan.get("model")), dataset_words(plan.get("dataset"))):
        if words:
            facts.append(words)
    return facts


def record_blocks(path: Path, data: dict | None, ctx: Ctx) -> list[Block]:
    """Under a result's heading: its source file, the facts its plan records, and a busy machine."""
    blocks = [para("Source: ", code(ctx.shown(path)))]
    facts = plan_facts((data or {}).get("plan") if isinstance(data, dict) else None)
    if facts:
        blocks.append(para("Ran with " + "; ".join(facts) + "."))
    busy = busy_reason(((data or {}).get("env") or {}).get("load") if isinstance(data, dict) else None)
    if busy:
        blocks.append(Block("note", f"Timed on a busy machine ({busy}): its times are not a quiet machine's."))
    return blocks
