"""Quoted output in the docs, made by the commands that print it.

A fenced block right after a marker is an excerpt:

    <!-- output: trainlab gpt plan --model gpt2-1.6b --micro-batch 8 -->      what the command prints
    <!-- output-log: benchmarks/results/x.log -->                             lines of a committed raw log

`python docs/excerpts.py` runs every `output:` command (in-process, cheap deterministic commands only:
plan tables, --help, data show…) and rewrites its block; `--check` rewrites nothing and exits 1 naming
each block that no longer matches. An `output-log:` block quotes a long run: each of its lines must be
a line of that log (the run's own record), so it is checked without running it again. Before comparing,
timings (`12.3 s`, `4.5 ms`) and this checkout's path are normalised. tests/test_walkthrough.py runs
the check, so a doc cannot drift from the tool.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/*.md")
_BLOCK = re.compile(r"<!-- (output|output-log): (.+?) -->\n(```[a-z]*\n)(.*?)(```)", re.S)
_TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:s|ms|µs|min)\b")


@dataclass
class Excerpt:
    doc: Path
    kind: str       # "output" (run the command) or "output-log" (lines of a committed log)
    source: str     # the command line, or the log's path relative to the repository
    quoted: str     # the block's text as the doc has it
    span: tuple[int, int]  # where the block's text sits in the doc


def doc_paths(root: Path = ROOT) -> list[Path]:
    return sorted({p for pattern in DOCS for p in root.glob(pattern)})


def excerpts(doc: Path, text: str | None = None) -> list[Excerpt]:
    text = doc.read_text() if text is None else text
    return [Excerpt(doc, m.group(1), m.group(2).strip(), m.group(4), m.span(4)) for m in _BLOCK.finditer(text)]


def normalise(text: str) -> str:
    text = text.replace(str(ROOT) + "/", "")
    return "\n".join(_TIMING.sub("<time>", line).rstrip() for line in text.strip("\n").splitlines())


def run(command: str) -> str:
    """What `command` (a `trainlab …` line) prints on stdout, run in this process."""
    from trainlab import cli

    argv = shlex.split(command)
    if argv[:1] != ["trainlab"]:
        raise ValueError(f"not a trainlab command: {command}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = cli.main(argv[1:])
        except SystemExit as e:  # --help
            code = e.code
    if code:
        raise RuntimeError(f"{command}: exit {code}")
    return out.getvalue()


def problem(ex: Excerpt, root: Path = ROOT) -> str | None:
    """Why the excerpt no longer matches its source, or None."""
    quoted = normalise(ex.quoted)
    if ex.kind == "output":
        fresh = normalise(run(ex.source))
        return None if fresh == quoted else f"{ex.doc.name}: the output of `{ex.source}` changed:\n{fresh}"
    log = root / ex.source
    if not log.is_file():
        return f"{ex.doc.name}: {ex.source}: no such log"
    lines = set(normalise(log.read_text()).splitlines())
    missing = [line for line in quoted.splitlines() if line.strip() and line not in lines]
    return f"{ex.doc.name}: not in {ex.source}: {missing[0]!r}" if missing else None


def regenerate(doc: Path) -> bool:
    """Rewrite every `output:` block of `doc` with what its command prints now; True if it changed."""
    text = doc.read_text()
    for ex in reversed(excerpts(doc, text)):
        if ex.kind == "output":
            fresh = run(ex.source).strip("\n").replace(str(ROOT) + "/", "") + "\n"
            text = text[:ex.span[0]] + fresh + text[ex.span[1]:]
    changed = text != doc.read_text()
    if changed:
        doc.write_text(text)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 if an excerpt drifted")
    args = ap.parse_args(argv)
    if args.check:
        problems = [p for doc in doc_paths() for ex in excerpts(doc) if (p := problem(ex))]
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    for doc in doc_paths():
        if regenerate(doc):
            print(f"rewrote {doc.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    raise SystemExit(main())
