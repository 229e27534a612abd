"""The configs of `trainlab ops check|bench` and of their alias `trainlab gelu check|bench`: one
dataclass each, flags derived from the fields. The alias configs are the ops configs with the
operator fixed to gelu and only GELU's flags."""

from __future__ import annotations

from dataclasses import dataclass

from trainlab.errors import ConfigError
from trainlab.flags import Config, at_least, one_of, opt, output_dir, positive, thread_count
from trainlab.ops.choices import (
    APPROXIMATIONS,
    DEFAULT_BATCHES,
    DEFAULT_SIZES,
    DTYPE_BYTES,
    QUICK_SIZES,
    canonical_impls,
    format_size,
    parse_size,
)
from trainlab.ops.registry import OPS

BENCH_COPIES = 8  # tensors of --sizes elements alive at once in the GELU bench (x, grad, per-impl inputs, outputs)
MAX_CHECK_N = 2**24  # --n: a correctness row keeps ~10 float64 copies of its input (2.5 GiB at this size)
MAX_BATCH = 65536  # --batch of `ops bench`: conv1's activations and gradients alone are ~40 MiB per 1K samples


def count(lo: int, hi: int, why: str):
    """A flag check: an integer in [lo, hi], the upper bound named with why — before anything is allocated."""

    def check(v) -> str | None:
        problem = at_least(lo)(v)
        return problem if problem is not None or v <= hi else f"expected an integer >= {lo} and <= {hi:,} ({why})"

    return check


def parse_ops(ops: list[str] | None) -> list[str]:
    """--op as a list of operators (comma-separated and/or repeated); ConfigError for an unknown one."""
    chosen = [o.strip() for item in (ops or [",".join(OPS)]) for o in item.split(",") if o.strip()]
    for op in chosen:
        if op not in OPS:
            raise ConfigError(f"--op {op!r}: unknown operator; choose from {', '.join(OPS)}")
    if not chosen:
        raise ConfigError(f"--op {','.join(ops or [])!r}: expected operators, e.g. {','.join(OPS)}")
    return list(dict.fromkeys(chosen))


def gelu_bench_sizes(sizes: str | None, quick: bool, dtype: str, device: str) -> list[int]:
    """The element counts of the GELU bench: --sizes parsed, and checked to fit the device."""
    chosen = [parse_size(s) for s in sizes.split(",")] if sizes else (QUICK_SIZES if quick else DEFAULT_SIZES)
    from trainlab.device import resolve_device, total_memory_bytes  # torch: only when a bench is run

    where = resolve_device(device)
    need = max(chosen) * DTYPE_BYTES[dtype] * BENCH_COPIES
    have = total_memory_bytes(where)
    if have is not None and need > have:
        raise ConfigError(
            f"--sizes {format_size(max(chosen))}: the benchmark holds about {BENCH_COPIES} tensors of that "
            f"many {dtype} elements ({need / 2**30:,.1f} GiB); {where} has {have / 2**30:,.1f} GiB"
        )
    return chosen


@dataclass
class CheckConfig(Config):
    """Correctness table of every GELU rung: `trainlab gelu check`, an alias of `trainlab ops check --op gelu`
    (--approximate picks GELU's cases of those approximations)."""

    json: bool = opt(False, "print one JSON document instead of the table")
    impl: list[str] | None = opt(None, "only these rungs (repeatable): aten, python, cpp, triton, cuda (default: all)")
    approximate: list[str] | None = opt(None, "only these approximations (repeatable)", choices=APPROXIMATIONS)
    dtype: list[str] | None = opt(None, "only these dtypes (repeatable)", choices=tuple(DTYPE_BYTES))
    n: int = opt(
        4096,
        "random elements per row besides the edge values",
        check=count(1, MAX_CHECK_N, "a correctness row, not a benchmark"),
    )

    def validate(self) -> None:
        super().validate()
        self.impl = canonical_impls(self.impl) or None


@dataclass
class OpsCheckConfig(CheckConfig):
    """Correctness of every rung of every operator against a float64 reference (`trainlab ops check`)."""

    op: list[str] | None = opt(
        None, f"only these operators, comma-separated or repeated: {','.join(OPS)} (default: all)"
    )
    dtype: list[str] | None = opt(
        None,
        "only these dtypes (repeatable; default: float32 and bfloat16, and float64 for gelu)",
        choices=tuple(DTYPE_BYTES),
    )
    case: list[str] | None = opt(
        None, "only these shape cases, e.g. lenet-conv1, batch1 (repeatable; gelu's one case is 'elementwise')"
    )
    batch: int = opt(8, "batch size of the LeNet-shaped cases", check=at_least(1))
    gelu: bool = opt(True, "with the default --op, include gelu (--no-gelu: the layer operators only)")
    out: str | None = opt(None, "also write ops_check.json/.md/.log into this directory", check=output_dir)

    def validate(self) -> list[str]:
        """Every declared range; returns the operators to check."""
        super().validate()
        ops = parse_ops(self.op)
        return ops if self.gelu or self.op else [o for o in ops if o != "gelu"]


@dataclass
class BenchConfig(Config):
    """Speed table of every GELU rung vs F.gelu (`trainlab gelu bench`, the same as `trainlab ops bench --op gelu`)."""

    json: bool = opt(False, "print one JSON document instead of the table")
    sizes: str | None = opt(None, "GELU: comma-separated element counts, e.g. 1K,1M,16M (default 1K…64M)")
    quick: bool = opt(False, "a smoke run: GELU sizes 1K,64K,1M, layer batch 256 only, a short time budget")
    impl: list[str] | None = opt(None, "only these rungs (repeatable; aten is always included)")
    dtype: str = opt("float32", "GELU: float32 | bfloat16 | float64", check=one_of(("float32", "bfloat16", "float64")))
    approximate: str = opt("none", "GELU: " + " | ".join(APPROXIMATIONS), check=one_of(APPROXIMATIONS))
    device: str = opt("auto", "auto | cpu | cuda")
    budget: float = opt(0.5, "seconds of timed runs per measurement (min 5 runs)", check=positive)
    out: str | None = opt(
        None, "also write gelu_bench.json/.md/.log (ops_bench.* for the layers) into this directory", check=output_dir
    )

    def validate(self) -> list[int]:
        """Every declared range, and sizes that parse and fit the device; returns the sizes to time."""
        super().validate()
        self.impl = canonical_impls(self.impl, extra=("cuda-atomic",)) or None
        return gelu_bench_sizes(self.sizes, self.quick, self.dtype, self.device)


@dataclass
class OpsBenchConfig(BenchConfig):
    """Forward and backward time of every rung vs aten (`trainlab ops bench`): LeNet-5's layers at their
    real shapes, and GELU over sizes."""

    op: list[str] | None = opt(
        None,
        "only these operators, comma-separated or repeated: "
        f"{','.join(OPS)} (default: the layer operators; gelu only when named)",
    )
    batch: str = opt(",".join(map(str, DEFAULT_BATCHES)), "layers: comma-separated batch sizes")
    impl: list[str] | None = opt(
        None, "only these rungs (repeatable; aten is always included; cuda-atomic: the naive pool backward, GPU only)"
    )
    layer: list[str] | None = opt(None, "only these LeNet-5 layers, e.g. conv1 (an unknown name lists them)")
    threads: int | None = opt(
        None, "torch CPU threads (default: torch's choice; at most this machine's CPUs)", check=thread_count
    )
    budget: float = opt(1.0, "seconds of timed runs per layer and rung (at least 5 runs)", check=positive)
    out: str | None = opt(
        None, "also write ops_bench.json/.md/.log (gelu_bench.* for gelu) into this directory", check=output_dir
    )

    def operators(self) -> list[str]:
        return parse_ops(self.op) if self.op else [o for o in OPS if o != "gelu"]

    def batches(self, explicit_batch: bool = True) -> list[int]:
        """--batch as sizes (with --quick and no --batch: 256 only); ConfigError for anything else."""
        if self.quick and not explicit_batch:
            return [DEFAULT_BATCHES[0]]
        try:
            batches = [int(b) for b in self.batch.split(",") if b.strip()]
        except ValueError:
            raise ConfigError(f"--batch {self.batch!r}: expected comma-separated integers, e.g. 256,4096") from None
        if not batches or any(b < 1 or b > MAX_BATCH for b in batches):
            raise ConfigError(f"--batch {self.batch!r}: expected batch sizes from 1 to {MAX_BATCH:,}, e.g. 256,4096")
        return batches
