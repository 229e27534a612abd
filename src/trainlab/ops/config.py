"""The configs of `trainlab gelu check|bench`: one dataclass each, flags derived from the fields."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainlab.device import resolve_device, total_memory_bytes
from trainlab.errors import ConfigError
from trainlab.flags import Config, at_least, one_of, opt, output_dir, positive
from trainlab.ops.bench import DEFAULT_SIZES, QUICK_SIZES, format_size, parse_size

BENCH_COPIES = 8  # tensors of --sizes elements alive at once in `gelu bench` (x, grad, per-impl inputs, outputs)


@dataclass
class CheckConfig(Config):
    """Correctness table of every GELU implementation (`trainlab gelu check`)."""

    json: bool = opt(False, "print one JSON document instead of the table")
    impl: list[str] | None = opt(None, "only these impls (repeatable; default: all)")
    approximate: list[str] | None = opt(None, "only these approximations (repeatable)", choices=("none", "tanh"))
    dtype: list[str] | None = opt(None, "only these dtypes (repeatable)", choices=("float32", "float64", "bfloat16"))
    n: int = opt(4096, "random elements per row besides the edge values", check=at_least(1))


@dataclass
class BenchConfig(Config):
    """Speed table of every GELU implementation vs F.gelu (`trainlab gelu bench`)."""

    json: bool = opt(False, "print one JSON document instead of the table")
    sizes: str | None = opt(None, "comma-separated element counts, e.g. 1K,1M,16M (default 1K…64M)")
    quick: bool = opt(False, "sizes 1K,64K,1M and a short time budget")
    impl: list[str] | None = opt(None, "only these impls (repeatable; torch is always included)")
    dtype: str = opt("float32", "float32 | bfloat16 | float64", check=one_of(("float32", "bfloat16", "float64")))
    approximate: str = opt("none", "none | tanh", check=one_of(("none", "tanh")))
    device: str = opt("auto", "auto | cpu | cuda")
    budget: float = opt(0.5, "seconds of timed runs per measurement (min 5 runs)", check=positive)
    out: str | None = opt(None, "also write gelu_bench.json/.md/.log into this directory", check=output_dir)

    def validate(self) -> list[int]:
        """Every declared range, and sizes that parse and fit the device; returns the sizes to time."""
        super().validate()
        sizes = [parse_size(s) for s in self.sizes.split(",")] if self.sizes else (QUICK_SIZES if self.quick else DEFAULT_SIZES)
        device = resolve_device(self.device)
        need = max(sizes) * torch.finfo(getattr(torch, self.dtype)).bits // 8 * BENCH_COPIES
        have = total_memory_bytes(device)
        if have is not None and need > have:
            raise ConfigError(f"--sizes {format_size(max(sizes))}: the benchmark holds about {BENCH_COPIES} tensors of that "
                              f"many {self.dtype} elements ({need / 2**30:,.1f} GiB); {device} has {have / 2**30:,.1f} GiB")
        return sizes
