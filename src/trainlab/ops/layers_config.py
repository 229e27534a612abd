"""The configs of `trainlab ops check|bench`: one dataclass each, flags derived from the fields."""

from __future__ import annotations

from dataclasses import dataclass

from trainlab.errors import ConfigError
from trainlab.flags import Config, at_least, opt, output_dir, positive
from trainlab.ops.layer_args import IMPLS
from trainlab.ops.layers_bench import DEFAULT_BATCHES
from trainlab.ops.layers_check import DTYPES, OPS


@dataclass
class OpsCheckConfig(Config):
    """Correctness of every rung of conv2d / max_pool2d / linear / relu against ATen (`trainlab ops check`)."""

    json: bool = opt(False, "print one JSON document instead of the tables")
    op: list[str] | None = opt(None, "only these operators (repeatable; default: all)", choices=OPS)
    impl: list[str] | None = opt(None, "only these implementations (repeatable; default: all)", choices=IMPLS)
    dtype: list[str] | None = opt(None, "only these dtypes (repeatable; default: float32 and bfloat16)",
                                  choices=tuple(DTYPES))
    case: list[str] | None = opt(None, "only these shape cases, e.g. lenet-conv1, batch1 (repeatable)")
    batch: int = opt(8, "batch size of the LeNet-shaped cases", check=at_least(1))
    gelu: bool = opt(True, "also run `trainlab gelu check` and print its table after this one")
    out: str | None = opt(None, "also write ops_check.json/.md/.log into this directory", check=output_dir)


@dataclass
class OpsBenchConfig(Config):
    """Forward and backward time of every LeNet-5 layer per implementation vs ATen (`trainlab ops bench`)."""

    json: bool = opt(False, "print one JSON document instead of the table")
    batch: str = opt("256,4096", "comma-separated batch sizes")
    impl: list[str] | None = opt(None, "only these implementations (repeatable; aten is always included; "
                                       "cuda-atomic: the naive pool backward, GPU only)")
    layer: list[str] | None = opt(None, "only these layers: conv1 relu1 pool1 conv2 relu2 pool2 fc1 relu3 fc2 relu4 fc3")
    device: str = opt("auto", "auto | cpu | cuda")
    threads: int | None = opt(None, "torch CPU threads (default: torch's choice)", check=at_least(1))
    budget: float = opt(1.0, "seconds of timed runs per layer and implementation (at least 5 runs)", check=positive)
    quick: bool = opt(False, "batch 256 only, a short time budget (a smoke run)")
    out: str | None = opt(None, "also write ops_bench.json/.md/.log into this directory", check=output_dir)

    def batches(self, explicit_batch: bool = True) -> list[int]:
        """--batch as sizes (with --quick and no --batch: 256 only); ConfigError for anything else."""
        if self.quick and not explicit_batch:
            return [DEFAULT_BATCHES[0]]
        try:
            batches = [int(b) for b in self.batch.split(",") if b.strip()]
        except ValueError:
            raise ConfigError(f"--batch {self.batch!r}: expected comma-separated integers, e.g. 256,4096") from None
        if not batches or any(b < 1 for b in batches):
            raise ConfigError(f"--batch {self.batch!r}: expected positive batch sizes, e.g. 256,4096")
        return batches
