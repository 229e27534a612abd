"""`trainlab train`, `eval`, `sweep`, `dp compare` and `profile`: flags into a config, then the library.

The flags of `train` and `dp compare` are derived from `TrainConfig` and `CompareConfig`; `sweep` takes
every `train` flag as a comma-separated list (`flags.add_list_flags`) plus `SweepConfig`'s. With
`--nproc N` the resolved TrainConfig is handed to N torchrun workers as JSON (`trainlab worker SPEC.json`),
after every check that can run in the parent (flags, launch, the run directory) has passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from trainlab.errors import ConfigError
from trainlab.flags import (
    add_command,
    add_flags,
    add_list_flags,
    at_least,
    check_value,
    explicit_values,
    flag_name,
    json_output,
    list_values,
)
from trainlab.io import read_json, write_json_output
from trainlab.lenet.config import (
    NOT_SWEPT,
    RESUME_OVERRIDES,
    CompareConfig,
    ProfileConfig,
    SweepConfig,
    TrainConfig,
    apply_preset,
)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run's config: explicit flags win over the preset, which wins over the defaults."""
    explicit = explicit_values(args, TrainConfig)
    cfg = TrainConfig(**explicit)
    return apply_preset(cfg, explicit.get("preset", "default"), explicit=set(explicit))


def resumed_config(args: argparse.Namespace) -> TrainConfig:
    """A resumed run keeps its saved config. Flags in RESUME_OVERRIDES apply (--epochs rebuilds the LR
    schedule, see `lenet.checkpoint`); any other flag given with a value that differs from the saved one
    is refused, naming it: a flag is never silently ignored."""
    run_dir = Path(args.resume)
    if not run_dir.is_dir():
        raise ConfigError(f"--resume {run_dir}: no such run directory")
    path = run_dir / "config.json"
    saved = TrainConfig.from_dict(read_json(path), source=str(path))
    explicit = explicit_values(args, TrainConfig)
    if explicit.get("overwrite"):
        raise ConfigError(
            f"--overwrite with --resume {run_dir}: resuming continues the run; --overwrite would replace it"
        )
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    refused = [
        k for k, v in explicit.items() if k not in RESUME_OVERRIDES and k != "overwrite" and v != getattr(saved, k)
    ]
    if refused:
        given = ", ".join(f"{flag_name(fields[k])} {explicit[k]} (saved: {getattr(saved, k)})" for k in refused)
        raise ConfigError(
            f"--resume {run_dir}: {given}: a resumed run keeps the settings that decide its result; "
            "start a new run to change them (flags a resume may change: "
            f"{', '.join(flag_name(fields[k]) for k in RESUME_OVERRIDES)})"
        )
    overrides = {k: v for k, v in explicit.items() if k in RESUME_OVERRIDES}
    return dataclasses.replace(saved, **{"stop_after": None, "overwrite": False, **overrides})


def run_train(args: argparse.Namespace) -> int:
    from trainlab.distributed.launch import launch_workers, needs_launch
    from trainlab.lenet.data_parallel import check_launch, check_rank_devices
    from trainlab.lenet.loop import default_run_dir
    from trainlab.lenet.shard_weights import check_shard_weights, slowdown_factor
    from trainlab.telemetry.rundir import check_run_dir

    check_value(args.nproc, at_least(1), "--nproc")
    cfg = resumed_config(args) if args.resume else config_from_args(args)
    cfg.validate()
    # All launch problems (mode, --nproc vs GPUs, batch vs world size) fail here, before any process starts.
    # a mixed world (--rank-devices) has one GPU rank at most per GPU, not one per process: checked below
    check_launch(cfg.parallel, args.nproc, "cpu" if cfg.rank_devices else cfg.device, cfg.batch_size)
    check_shard_weights(cfg.shard_weights, cfg.parallel, args.nproc, cfg.batch_size)
    check_rank_devices(cfg.rank_devices, cfg.parallel, cfg.device, args.nproc)
    slowdown_factor(0)  # $TRAINLAB_SLOW_RANKS, parsed whole before any process starts
    for flag, images in (("--train-subset", cfg.train_subset), ("--test-subset", cfg.test_subset)):
        if images is not None and images < args.nproc:  # a rank with no image has nothing to average
            raise ConfigError(
                f"{flag} {images}: fewer images than the {args.nproc} ranks of --nproc {args.nproc}; "
                "every rank needs at least one"
            )
    if args.resume:
        check_run_dir(args.resume, resume=True, flag="--resume")
    else:
        cfg = dataclasses.replace(cfg, out=str(default_run_dir(cfg)))  # one name for the parent and every rank
        check_run_dir(cfg.out, overwrite=cfg.overwrite)
    if needs_launch(args.nproc):
        return launch_workers(args.nproc, "train", config=cfg.to_dict(), resume=args.resume)
    return _train_and_report(cfg, args.resume)


def train_worker(spec: dict) -> int:
    """One torchrun rank of `trainlab train --nproc N`: the parent's resolved config, from JSON."""
    return _train_and_report(TrainConfig.from_dict(spec["config"], source="train spec"), spec.get("resume"))


def _train_and_report(cfg: TrainConfig, resume: str | None) -> int:
    from trainlab.lenet.loop import train

    summary = train(cfg, resume=resume)
    if summary.get("step_times") and int(os.environ.get("RANK", "0")) == 0:
        st = summary["step_times"]
        print(
            f"per step (median ms): data {st['data_ms']['median']:.2f}  compute {st['compute_ms']['median']:.2f}  "
            f"communication {st['comm_ms']['median']:.2f}{' (overlapped with backward)' if st['comm_overlapped'] else ''}"
        )
    return 0 if summary else 1


def run_eval(args: argparse.Namespace) -> int:
    from trainlab.lenet.evaluate import evaluate_checkpoint

    if args.json is not None:
        check_value(args.json, json_output, "--json")
    result = evaluate_checkpoint(args.checkpoint, device=args.device, data_dir=args.data_dir)
    if args.json is not None:
        write_json_output(args.json, result)
    if args.json != "-":
        print(f"data: {result['data']}")
        print(
            f"{args.checkpoint}: test accuracy {result['test_accuracy']:.2f}%  test loss {result['test_loss']:.4f}  "
            f"({result['test_samples']} images, {result['weights']} weights, device {result['device']})"
        )
        print("per-class accuracy: " + "  ".join(f"{c}:{a:.2f}" for c, a in enumerate(result["per_class_accuracy"])))
    return 0


def run_sweep_command(args: argparse.Namespace) -> int:
    from trainlab.lenet.sweep import run_sweep

    failed = run_sweep(
        list_values(args, TrainConfig, exclude=NOT_SWEPT),
        SweepConfig(**explicit_values(args, SweepConfig)),
        command=args.command_line,
    )
    return 1 if failed else 0


def run_dp_compare(args: argparse.Namespace) -> int:
    from trainlab.lenet.compare import run_compare

    run_compare(CompareConfig(**explicit_values(args, CompareConfig)))  # validated before the first run
    return 0


def run_async(args: argparse.Namespace) -> int:
    from trainlab.lenet.asynchrony import run_async_cmd
    from trainlab.lenet.config import AsyncConfig

    run_async_cmd(AsyncConfig(**explicit_values(args, AsyncConfig)))
    return 0


def run_profile(args: argparse.Namespace) -> int:
    from trainlab.lenet.profile import run_profile_cmd

    return run_profile_cmd(ProfileConfig(**explicit_values(args, ProfileConfig)), args.command_line)


# The parsers (`cli.COMMANDS` names these functions): flags from the configs, nothing else imported.


def add_train(p: argparse.ArgumentParser) -> None:
    add_flags(p, TrainConfig)
    p.add_argument("--resume", metavar="RUN_DIR", default=None, help="continue an interrupted run from its checkpoint")
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes on this node (relaunches under torchrun; with --parallel ddp|allreduce|ring)",
    )
    p.set_defaults(func=run_train)


def add_eval(e: argparse.ArgumentParser) -> None:
    e.add_argument("checkpoint", help="checkpoint.pt or its run directory")
    e.add_argument("--device", default="auto", help="auto (CUDA if available) | cpu | cuda | cuda:N")
    e.add_argument(
        "--data-dir",
        default=None,
        help="MNIST IDX folder or pack file to test on (default: the checkpoint's "
        "own --data-dir, else the embedded MNIST)",
    )
    e.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="write the result as JSON to PATH ('-': print it instead of the text)",
    )
    e.set_defaults(func=run_eval)


def add_sweep(s: argparse.ArgumentParser) -> None:
    s.description = (
        "Train LeNet-5 for every combination of the listed flag values and seeds. "
        "Every train flag takes a comma-separated list, e.g. --optimizer adam,sgd "
        "--lr 1e-3,2e-3 --seeds 3. `trainlab report OUT` shows mean ± sd per configuration."
    )
    add_flags(s, SweepConfig)
    add_list_flags(s, TrainConfig, exclude=NOT_SWEPT)
    s.set_defaults(func=run_sweep_command)


def add_dp(d: argparse.ArgumentParser) -> None:
    d.description = (
        "Data-parallel LeNet-5: single process, nn.DataParallel, DDP, a hand-written "
        "bucketed all-reduce and a ring all-reduce from send/recv."
    )
    sub = d.add_subparsers(dest="dp_command", metavar="SUBCOMMAND")
    sub.required = True
    add_command(
        sub,
        "compare",
        "run several modes on the same global batches and say where the time goes",
        CompareConfig,
        run_dp_compare,
    )


def add_profile(p: argparse.ArgumentParser) -> None:
    add_flags(p, ProfileConfig)
    p.set_defaults(func=run_profile)


def add_async(p: argparse.ArgumentParser) -> None:
    from trainlab.lenet.config import AsyncConfig

    add_flags(p, AsyncConfig)
    p.set_defaults(func=run_async)
