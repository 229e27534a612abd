"""A lab step: a name, a title, its time on this machine, and one `Command` — a program and its typed
config, from which both the line a student types and the argv the lab runs are derived."""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainlab.flags import to_argv

SIZES = ("tiny", "small", "full")


def repo_root() -> Path:
    """The checkout trainlab runs from (src/trainlab/lab/steps/base.py → the repository)."""
    return Path(__file__).resolve().parents[4]


def pick(size: str, tiny, small, full):
    """The value of this size: tiny (CI), small (the CPU hand-in), full (GPUs)."""
    return {"tiny": tiny, "small": small, "full": full}[size]


@dataclass(frozen=True, eq=False)
class Command:
    """`program` (`("trainlab", "train")`, or `("python", "benchmarks/x.py")`) with `config`'s flags: those
    that differ from `defaults` (default: the dataclass's; a preset's config for `--preset`), the fields
    named in `nested` (field → flags its command leaves out) flattened in. "{out}" in a value stands for
    the step's output folder. `config=None` is a bare program (the runner's own tests' stand-ins)."""

    program: tuple[str, ...]
    config: Any = None
    defaults: Any = None
    nested: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def words(self) -> list[str]:
        flags = [] if self.config is None else to_argv(self.config, self.defaults, nested=dict(self.nested))
        return [*self.program, *flags]

    def line(self, out: str) -> str:
        """What a student types, "{out}" as `out` (a path relative to the lab folder: no machine's paths)."""
        return shlex.join(w.replace("{out}", out) for w in self.words())

    def argv(self, out: str) -> list[str]:
        """What the lab runs: this Python, and a script by its path in this checkout."""
        words = [w.replace("{out}", out) for w in self.words()]
        if words[0] == "trainlab":
            return [sys.executable, "-m", "trainlab", *words[1:]]
        if words[0] == "python":
            script = words[1:2] if words[1:2] and words[1].endswith(".py") else []
            return [sys.executable, *(str(repo_root() / s) for s in script), *words[1 + len(script) :]]
        return words


def trainlab(*words: str, config, defaults=None, nested: dict | None = None) -> Command:
    return Command(("trainlab", *words), config, defaults, tuple((nested or {}).items()))


def script(config) -> Command:
    from trainlab.lab.steps.scripts import SCRIPTS

    return Command(("python", SCRIPTS[type(config)]), config)


@dataclass(frozen=True)
class Step:
    name: str
    part: str
    title: str
    estimate_s: float  # expected seconds on this hardware at this size
    command: Command
    stdout_file: str | None = None  # also keep stdout alone in {out}/<this> (a command's --json output)
    sizes: dict = field(default_factory=dict)  # what was chosen for this hardware (recorded)
    cannot_run: str | None = None  # why this step cannot run here at all (recorded as "not run: …")
    min_limit_s: float = 60.0  # a floor under the limit, for a step whose time varies by GPU far more than 3×

    @property
    def limit_s(self) -> float:
        """The hard limit: a step that takes three times its estimate is broken, not slow."""
        return max(self.min_limit_s, 3.0 * self.estimate_s)

    @property
    def config(self):
        return self.command.config
