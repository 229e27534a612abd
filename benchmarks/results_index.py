"""Write benchmarks/results/INDEX.md: every committed result, what produced it and where it is cited.

A *stem* is a result's path under benchmarks/results/ without its extension (`dp_compare` stands for
dp_compare.md, .json, .log, .loaders.json); a folder of one run's files (`gpt_compare_cpu_tiny/`) is one
entry. For each entry the index gives the command that produced it, read from the files themselves (a
`Command: ...` line in the .md, a `$ ...` first line in the .log/.txt, a "command" key in the .json), and
the pages and scripts that cite it (README.md, docs/, benchmarks/, tests/, src/). An entry nothing cites
must say here why it is kept (UNCITED), so results do not pile up unexplained.

    python benchmarks/results_index.py            # rewrite the index
    python benchmarks/results_index.py --check    # exit 1 if it is not current (tests/test_results_index.py)
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "INDEX.md"
# where a result counts as cited: the pages people read, and the tests that check quoted figures (a script
# writing its default output name, or a lab step of the same name, is not a citation)
CITERS = ("README.md", "docs/*.md", "benchmarks/*.md", "tests/*.py")
SUFFIXES = (".loaders.json", ".stdout.json", ".spec.json", ".md", ".json", ".log", ".txt", ".csv", ".png")
FOLDERS = ("gpu/h100", "gpu/h200")  # deeper folders that are one run each

# Why a result nothing cites is kept. Keys are entries or fnmatch patterns over entries.
UNCITED = {
    "lenet_accuracy_best_relu.s*": "one seed's part of lenet_accuracy_best_relu (run two at a time, then --merge)",
    "data_diversity_*": "a variant of data_diversity (another seed / distinct-image count), same script",
    "dp_compare_default_threads": "dp_compare with torch's default thread count: the 1-thread table is the one quoted",
    "gelu_bench_16M_*": "gelu_bench_16M's variants (1 thread, bf16, tanh form), the rows behind its footnotes",
    "gpt_bench_cpu_tiny": "one `gpt bench` on the tiny model: the smoke run behind gpt_compare_cpu_tiny",
    "gpt_build_time": "time to build the 1.6B model on meta/CPU, measured for the lab's estimates",
    "gpt_plan_1.6b_2x80GiB": "the 1.6B plan for 2 GPUs of 80 GiB, the course node's shape",
    "gpt_planner_error_cpu_tiny*": "the planner's predicted vs measured peak on the tiny model (math attention too)",
    "lab_gpu_lease_plan": "`trainlab lab --plan` for the H100 lease, before the run in gpu/h100",
    "lenet_cpu_step_fast": "the `fast` step before the fused first stage: the baseline lenet_cpu_step_fused improves on",
    "lenet_time_to_99_cpu_1thread_loaded": "time to 99 % with one thread on a loaded box: why ratios, not seconds",
    "lenet_recipe_ablation_parts": "per-variant parts merged into lenet_recipe_ablation",
    "lenet_time_to_99_parts": "per-seed parts merged into the lenet_time_to_99_cpu* tables",
    "lenet_fast_validation_parts": "per-candidate and per-seed parts merged into lenet_fast_validation",
    "lenet_fast_validation_ema_parts": "per-candidate parts merged into lenet_fast_validation_ema",
    "lenet_fast_validation_r3_parts": "per-candidate parts merged into lenet_fast_validation_r3",
    "lenet_fast_validation_r6_parts": "the fast preset re-validated on 20 seeds after its step became capturable",
    "lenet_models": "architectures compared (--model), the walkthrough's overfitting table source",
    "worker_end_stress_*": "the DataLoader worker-shutdown stress test before and after its fix",
    "dp_shard_weights": "`--shard-weights` on devices of unequal speed (docs/beyond-lenet.md runs its script)",
    "install": "api_compat runs: which torch/triton APIs each supported version has",
}


def entries(results: Path = RESULTS) -> dict[str, list[Path]]:
    """entry name -> its files."""
    out: dict[str, list[Path]] = {}
    for path in sorted(results.rglob("*")):
        if not path.is_file() or path == INDEX or path.name.startswith("."):
            continue  # (a dotfile is local: trainlab's record of the files it wrote there, git-ignored)
        rel = path.relative_to(results).as_posix()
        folder = next((f for f in FOLDERS if rel.startswith(f + "/")), None)
        if folder is None and "/" in rel:
            folder = rel.split("/")[0]
        if folder is None:
            name = rel
            for suffix in SUFFIXES:
                if name.endswith(suffix):
                    name = name[: -len(suffix)]
                    break
        out.setdefault(folder or name, []).append(path)
    return out


def producer(files: list[Path]) -> str:
    """The command that produced an entry, read from its own files, or ''."""
    for path in sorted(
        files, key=lambda p: (p.name != "README.md", p.suffix != ".md", p.suffix != ".log", len(p.parts), p.name)
    ):
        try:
            head = path.read_text(errors="replace")[:4000]
        except OSError:
            continue
        if path.name == "README.md":  # a run's provenance: its first indented command
            m = re.search(r"(?m)^    (\S.*trainlab.*)$", head)
            if m:
                return m.group(1) + " …"
        elif path.suffix == ".md":
            m = re.search(r"(?m)^Command: `(.+?)`", head)
            if m:
                return m.group(1)
        elif path.suffix in (".log", ".txt"):
            first = head.splitlines()[0] if head else ""
            if first.startswith("$ "):
                return first[2:]
        elif path.suffix == ".json":
            m = re.search(r'"command":\s*("(?:[^"\\]|\\.)*")', head)
            if m:
                return json.loads(m.group(1))
    return ""


def _short(command: str) -> str:
    command = re.sub(r"\S*/(?:python3?|\.venv/bin/python3?)\b", "python", command)
    command = command.replace(str(ROOT) + "/", "")
    return command if len(command) <= 160 else command[:157] + "…"


def citers(root: Path = ROOT) -> dict[str, str]:
    texts = {}
    for pattern in CITERS:
        for path in sorted(root.glob(pattern)):
            if path.is_file() and path.resolve() != Path(__file__).resolve():
                texts[path.relative_to(root).as_posix()] = path.read_text(errors="replace")
    return texts


@functools.cache
def _glob_stems(text: str) -> tuple[str, ...]:
    """The glob citations of one text (`lenet_fast_validation_r*`), as the stems a result's name must match:
    read once per text, not once per result (the index is rebuilt by two tests)."""
    return tuple(g.split("/")[-1].split(".")[0] for g in re.findall(r"[\w./-]*\*[\w.*{},-]*", text) if "_" in g)


def cited_in(name: str, texts: dict[str, str]) -> list[str]:
    base = name.rsplit("/", 1)[-1]
    exact = re.compile(rf"(?<![\w-]){re.escape(base)}(?![\w-])(?!\.(?:py|sh)\b)")
    where = []
    for doc, text in texts.items():
        if (base in text and exact.search(text)) or any(fnmatch.fnmatch(base, g) for g in _glob_stems(text)):
            where.append(doc)
    return where


def reason(name: str) -> str:
    return next((why for key, why in UNCITED.items() if fnmatch.fnmatch(name, key)), "")


def render(root: Path = ROOT) -> str:
    texts = citers(root)
    rows, uncited = [], 0
    for name, files in entries(root / "benchmarks" / "results").items():
        where = cited_in(name, texts)
        kinds = (
            sorted({p.name[len(name.rsplit("/", 1)[-1]) :] or p.name for p in files})
            if "/" not in name
            and not files[0].relative_to(root / "benchmarks" / "results").as_posix().startswith(name + "/")
            else [f"{len(files)} files"]
        )
        command = producer(files)
        cite = ", ".join(f"`{w}`" for w in where) or f"— *kept:* {reason(name) or '**no reason given**'}"
        uncited += not where
        cells = [f"`{name}`", " ".join(kinds), f"`{_short(command)}`" if command else "see the files", cite]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    generated = (
        "Generated by `python benchmarks/results_index.py` from the files themselves; "
        "`tests/test_results_index.py` fails when it is not current."
    )
    head = [
        "# benchmarks/results: what each result is, what made it, who cites it",
        "",
        generated,
        "",
        f"{len(rows)} entries (a folder of one run counts once); {uncited} cited nowhere, each with the reason it is kept.",
        "",
        "| result | files | produced by | cited in |",
        "| --- | --- | --- | --- |",
    ]
    return "\n".join(head + rows) + "\n"


def problems(root: Path = ROOT) -> list[str]:
    """Entries nothing cites and no UNCITED reason covers."""
    texts = citers(root)
    return [name for name in entries(root / "benchmarks" / "results") if not cited_in(name, texts) and not reason(name)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if INDEX.md is not current")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        stale = not INDEX.is_file() or INDEX.read_text() != text
        for name in problems():
            print(f"benchmarks/results/{name}: cited nowhere and no reason in UNCITED", file=sys.stderr)
        if stale:
            print("benchmarks/results/INDEX.md is not current: run python benchmarks/results_index.py", file=sys.stderr)
        return 1 if stale or problems() else 0
    INDEX.write_text(text)
    print(f"wrote {INDEX.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
