"""Which torch/triton APIs does trainlab use, and does a given torch/triton have every one of them?

trainlab supports torch 2.11-2.13 and runs on GPU images that ship their own torch (2.11 + CUDA 13,
triton 3.6, Python 3.12) with no network to upgrade it. This script
  1. collects every dotted torch/triton name the code refers to (import statements and attribute
     chains, through aliases such as `F` = torch.nn.functional or `tl` = triton.language), from
     src/, benchmarks/ and tests/, by parsing the source (nothing is imported);
  2. resolves each name in the interpreter it runs under (import the longest module prefix, then
     getattr along the rest), and writes the verdict next to the versions it was taken with.

    python benchmarks/api_compat.py --out benchmarks/results/install     # run under torch 2.11

tests/test_compat.py compares today's collection with the committed verdict for torch 2.11: a
newly used API must either exist there or be listed as guarded (used behind a fallback).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOTS = ("torch", "triton")
SCANNED = ("src", "benchmarks", "tests")
# Our own operator namespace exists only once the extension is loaded; not a torch API.
OWN_PREFIXES = ("torch.ops.trainlab",)


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def collect_file(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases: dict[str, str] = {}
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ROOTS:
                    used.add(a.name)
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif (
            isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] in ROOTS
        ):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                used.add(full)
                aliases[a.asname or a.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent_attr", None), ast.Attribute):
            chain = _dotted(node)
            if chain and chain[0] in aliases:
                used.add(".".join([aliases[chain[0]], *chain[1:]]))
        for child in ast.iter_child_nodes(node):
            child._parent_attr = node  # mark inner attributes so only the longest chain is kept
    return {u for u in used if not u.startswith(OWN_PREFIXES)}


def collect(root: Path = ROOT) -> dict[str, list[str]]:
    """{dotted name: [files using it]} over src/, benchmarks/, tests/."""
    found: dict[str, list[str]] = {}
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            for name in collect_file(path):
                found.setdefault(name, []).append(str(path.relative_to(root)))
    return dict(sorted(found.items()))


def resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            return True
        except AttributeError:
            return False
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/api_compat", help="directory for api_compat_<versions>.json")
    ap.add_argument("--force", action="store_true", help="overwrite a verdict already in --out for these versions")
    args = ap.parse_args()
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    used = collect()
    verdict = {name: resolves(name) for name in used}
    versions = {"torch": torch.__version__, "triton": triton_version, "python": sys.version.split()[0]}
    stem = f"api_compat_torch{torch.__version__.split('+')[0]}_triton{triton_version}_py{sys.version_info[0]}.{sys.version_info[1]}"
    out = Path(args.out)
    target = out / f"{stem}.json"
    if target.exists() and not args.force:
        sys.exit(
            f"api_compat.py: error: {target} exists; pass --force to overwrite it, or --out DIR to write elsewhere"
        )
    out.mkdir(parents=True, exist_ok=True)
    missing = sorted(n for n, ok in verdict.items() if not ok)
    tmp = target.with_suffix(".json.tmp")  # temp file + rename: a killed run never leaves half a verdict
    tmp.write_text(
        json.dumps(
            {
                "command": "python benchmarks/api_compat.py --out " + args.out,
                "versions": versions,
                "present": verdict,
                "missing": {n: used[n] for n in missing},
            },
            indent=1,
        )
        + "\n"
    )
    os.replace(tmp, target)
    print(
        f"{len(used)} torch/triton names used; {len(missing)} missing in torch {versions['torch']}, "
        f"triton {versions['triton']}, Python {versions['python']}"
    )
    for n in missing:
        print(f"  missing: {n}  ({', '.join(used[n])})")
    print(f"wrote {out / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
