"""What the operator commands' flags accept, as plain names and numbers: the rungs, the dtypes, GELU's
approximations, the benchmark's sizes. No torch: `trainlab ops|gelu --help` and the lab's plan read
them without importing the operators (tests/test_cli.py)."""

from __future__ import annotations

import re

from trainlab.errors import ConfigError

IMPLS = ("aten", "python", "cpp", "triton", "cuda")
# Older spellings accepted on the command line (`trainlab gelu check --impl torch`, in earlier docs).
IMPL_ALIASES = {"torch": "aten"}
# the dtypes `ops check` runs in, and their bytes per element (the GELU bench sizes its memory by them)
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2}
APPROXIMATIONS = ("none", "tanh", "sigmoid")  # exact, tanh form, report 000's x sigmoid(1.702 x)


def canonical_impls(names, flag: str = "--impl", extra: tuple[str, ...] = ()) -> list[str]:
    """Command-line rung names, aliases resolved; ConfigError (one line) for an unknown one."""
    out = []
    for name in names or []:
        name = IMPL_ALIASES.get(name, name)
        if name not in IMPLS + extra:
            raise ConfigError(f"{flag} {name!r}: unknown implementation; choose one of {', '.join(IMPLS + extra)}")
        out.append(name)
    return out


DEFAULT_SIZES = [2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26]  # 1K … 64M elements
QUICK_SIZES = [2**10, 2**16, 2**20]
DEFAULT_BATCHES = (256, 4096)


def parse_size(text: str) -> int:
    """'1K' -> 1024, '16M' -> 16777216, '1000' -> 1000 (binary K/M/G)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise ConfigError(f"--sizes {text!r}: expected a number with an optional K/M/G suffix, e.g. 1K,16M")
    n = int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2).lower()]
    if n <= 0:
        raise ConfigError(f"--sizes {text!r}: sizes must be positive")
    return n


def format_size(n: int) -> str:
    for unit, v in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= v and n % v == 0:
            return f"{n // v}{unit}"
    return str(n)
