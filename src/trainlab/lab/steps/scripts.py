"""Typed configs of the `benchmarks/` scripts the lab runs, one dataclass per script, its fields the
script's flags (names, types and defaults as its argparse declares them: tests/test_lab_commands.py reads
each script's `add_argument` calls and fails on a field the script does not take, or a default that differs).

The scripts parse their own flags (they are standalone files); the lab states what it asks of them here,
so a lab step holds a config, never a typed-out argv, and the line is derived like any command's.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainlab.flags import Config, opt


@dataclass
class TimeTo99Config(Config):
    """benchmarks/lenet_time_to_99.py: seconds to 99 % test accuracy, per loop and seed."""

    device: str = opt("auto", "auto | cpu | cuda")
    seeds: str = opt("0,1,2,3,4", "comma-separated seeds")
    loops: str = opt("fast,default,seed-style", "comma-separated loops")
    max_epochs: int = opt(15, "the seed-style loop gives up after this many epochs")
    baseline_seeds: str | None = opt(None, "the seed-style loop on these seeds only")
    out: str | None = opt(None, "directory for the result files")


@dataclass
class TF32Config(Config):
    """benchmarks/lenet_tf32.py: LeNet-5's default recipe in fp32 with TF32 off and on."""

    device: str = opt("auto", "auto | cpu | cuda")
    epochs: int = opt(2, "epochs per run")
    rounds: int = opt(2, "off/on pairs, alternating")
    out: str | None = opt(None, "directory for the result files")


@dataclass
class CompileConfig(Config):
    """benchmarks/dp_compile.py: eager vs torch.compile vs CUDA graphs, and the asynchronous-timing demo."""

    device: str = opt("auto", "auto | cpu | cuda")
    steps: int = opt(50, "timed steps")
    threads: int | None = opt(None, "torch CPU threads")
    variants: str | None = opt(None, "comma-separated variants")
    out: str | None = opt(None, "directory for the result files")


@dataclass
class CompileBreaksConfig(Config):
    """benchmarks/compile_breaks.py: graph breaks and recompiles, counted by TorchDynamo."""

    batch: int = opt(16, "LeNet-5 batch for the break counts")
    out: str | None = opt(None, "directory for the result files")


@dataclass
class PlannerErrorConfig(Config):
    """benchmarks/gpt_planner_error.py: the planner's predicted peak memory against the measured one."""

    model: str = opt("tiny", "GPT preset")
    device: str = opt("cpu", "cpu | cuda")
    strategies: str = opt("none,amp,ckpt,ckpt-selective,amp+ckpt", "comma-separated strategies")
    micro_batches: str = opt("4,16", "comma-separated micro-batches")
    fused: bool = opt(False, "fused AdamW (GPU)")
    name: str = opt("gpt_planner_error_cpu_tiny", "result file stem")
    out: str | None = opt(None, "directory for the result files")


# the script each config belongs to, relative to the checkout
SCRIPTS = {
    TimeTo99Config: "benchmarks/lenet_time_to_99.py",
    TF32Config: "benchmarks/lenet_tf32.py",
    CompileConfig: "benchmarks/dp_compile.py",
    CompileBreaksConfig: "benchmarks/compile_breaks.py",
    PlannerErrorConfig: "benchmarks/gpt_planner_error.py",
}
