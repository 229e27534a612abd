"""The configs of `trainlab gelu check|bench`: one dataclass each, flags derived from the fields."""

from __future__ import annotations

from dataclasses import dataclass

from trainlab.flags import Config, opt


@dataclass
class CheckConfig(Config):
    """Correctness table of every GELU implementation (`trainlab gelu check`)."""

    json: bool = opt(False, "print one JSON document instead of the table")
    impl: list[str] | None = opt(None, "only these impls (repeatable; default: all)")
    approximate: list[str] | None = opt(None, "only these approximations (repeatable)", choices=("none", "tanh"))
    dtype: list[str] | None = opt(None, "only these dtypes (repeatable)", choices=("float32", "float64", "bfloat16"))
    n: int = opt(4096, "random elements per row besides the edge values")


@dataclass
class BenchConfig(Config):
    """Speed table of every GELU implementation vs F.gelu (`trainlab gelu bench`)."""

    json: bool = opt(False, "print one JSON document instead of the table")
    sizes: str | None = opt(None, "comma-separated element counts, e.g. 1K,1M,16M (default 1K…64M)")
    quick: bool = opt(False, "sizes 1K,64K,1M and a short time budget")
    impl: list[str] | None = opt(None, "only these impls (repeatable; torch is always included)")
    dtype: str = opt("float32", "float32 | bfloat16 | float64")
    approximate: str = opt("none", "none | tanh")
    device: str = opt("auto", "auto | cpu | cuda")
    budget: float = opt(0.5, "seconds of timed runs per measurement (min 5 runs)")
    out: str | None = opt(None, "also write gelu_bench.json/.md/.log into this directory")
