"""`trainlab train`, `trainlab eval` and `trainlab dp compare`: flags into a config, then the library.

The flags of `train` and `dp compare` are derived from `TrainConfig` and `CompareConfig`. With `--nproc N`
the resolved TrainConfig is handed to N torchrun workers as JSON (`trainlab worker SPEC.json`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

from trainlab.distributed.launch import launch_workers, needs_launch
from trainlab.errors import ConfigError
from trainlab.flags import add_command, add_flags, explicit_values
from trainlab.io import read_json
from trainlab.lenet.compare import CompareConfig, run_compare
from trainlab.lenet.config import TrainConfig, apply_preset
from trainlab.lenet.data_parallel import check_launch
from trainlab.lenet.evaluate import evaluate_checkpoint
from trainlab.lenet.loop import train

# Flags that cannot change a resumed run's result; every other flag is refused with --resume.
RESUME_OVERRIDES = ("epochs", "device", "progress", "tensorboard", "gpu_telemetry", "dist_timeout", "step_timing")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The run's config: explicit flags win over the preset, which wins over the defaults."""
    explicit = explicit_values(args, TrainConfig)
    cfg = TrainConfig(**explicit)
    return apply_preset(cfg, explicit.get("preset", "default"), explicit=set(explicit))


def resumed_config(args: argparse.Namespace) -> TrainConfig:
    """A resumed run keeps its saved config; only flags that cannot change the result may be overridden."""
    path = Path(args.resume) / "config.json"
    saved = TrainConfig.from_dict(read_json(path), source=str(path))
    overrides = {k: v for k, v in explicit_values(args, TrainConfig).items() if k in RESUME_OVERRIDES}
    return dataclasses.replace(saved, stop_after=None, **overrides)


def run_train(args: argparse.Namespace) -> int:
    cfg = resumed_config(args) if args.resume else config_from_args(args)
    if cfg.dist_timeout is not None and not cfg.dist_timeout > 0:
        raise ConfigError(f"--dist-timeout {cfg.dist_timeout:g}: expected a positive number of seconds")
    # All launch problems (mode, --nproc vs GPUs, batch vs world size) fail here, before any process starts.
    check_launch(cfg.parallel, args.nproc, cfg.device, cfg.batch_size)
    if needs_launch(args.nproc):
        return launch_workers(args.nproc, "train", config=cfg.to_dict(), resume=args.resume)
    return _train_and_report(cfg, args.resume)


def train_worker(spec: dict) -> int:
    """One torchrun rank of `trainlab train --nproc N`: the parent's resolved config, from JSON."""
    return _train_and_report(TrainConfig.from_dict(spec["config"], source="train spec"), spec.get("resume"))


def _train_and_report(cfg: TrainConfig, resume: str | None) -> int:
    summary = train(cfg, resume=resume)
    if summary.get("step_times") and int(os.environ.get("RANK", "0")) == 0:
        st = summary["step_times"]
        print(f"per step (median ms): data {st['data_ms']['median']:.2f}  compute {st['compute_ms']['median']:.2f}  "
              f"communication {st['comm_ms']['median']:.2f}{' (overlapped with backward)' if st['comm_overlapped'] else ''}")
    return 0 if summary else 1


def run_eval(args: argparse.Namespace) -> int:
    result = evaluate_checkpoint(args.checkpoint, device=args.device, data_dir=args.data_dir)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.checkpoint}: test accuracy {result['test_accuracy']:.2f}%  test loss {result['test_loss']:.4f}  "
              f"({result['test_samples']} images, {result['weights']} weights, device {result['device']})")
        print("per-class accuracy: " + "  ".join(f"{c}:{a:.2f}" for c, a in enumerate(result["per_class_accuracy"])))
    return 0


def run_dp_compare(args: argparse.Namespace) -> int:
    run_compare(CompareConfig(**explicit_values(args, CompareConfig)))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train LeNet-5 on MNIST", description="Train LeNet-5 on MNIST.")
    add_flags(p, TrainConfig)
    p.add_argument("--resume", metavar="RUN_DIR", default=None, help="continue an interrupted run from its checkpoint")
    p.add_argument("--nproc", type=int, default=1,
                   help="processes on this node (relaunches under torchrun; with --parallel ddp|allreduce)")
    p.set_defaults(func=run_train)

    e = subparsers.add_parser("eval", help="re-evaluate a checkpoint on the test set")
    e.add_argument("checkpoint", help="checkpoint.pt or its run directory")
    e.add_argument("--device", default="auto")
    e.add_argument("--data-dir", default=None)
    e.add_argument("--json", action="store_true", help="print JSON")
    e.set_defaults(func=run_eval)

    d = subparsers.add_parser("dp", help="data-parallel LeNet-5: compare none / dp / ddp / allreduce",
                              description="Data-parallel LeNet-5: single process, nn.DataParallel, DDP and a hand-written all-reduce.")
    sub = d.add_subparsers(dest="dp_command", metavar="SUBCOMMAND")
    sub.required = True
    add_command(sub, "compare", "run several modes on the same global batches and say where the time goes",
                CompareConfig, run_dp_compare)
