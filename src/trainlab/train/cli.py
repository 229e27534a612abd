"""`trainlab train` and `trainlab eval`: parse flags into a TrainConfig and call the library."""

from __future__ import annotations

import argparse
import dataclasses
import json

from trainlab.config import PRESETS, TrainConfig, apply_preset

# flag → (TrainConfig field, type, help). Every default lives in TrainConfig; flags default to None so
# we know which ones the user set explicitly (those win over a --preset).
TRAIN_FLAGS = {
    "--epochs": ("epochs", int, "passes over the training set"),
    "--batch-size": ("batch_size", int, "global batch size"),
    "--lr": ("lr", float, "peak learning rate"),
    "--optimizer": ("optimizer", str, "adamw | adam | sgd"),
    "--schedule": ("schedule", str, "onecycle | cosine | constant"),
    "--warmup-epochs": ("warmup_epochs", float, "linear warm-up (cosine/constant)"),
    "--weight-decay": ("weight_decay", float, "weight decay"),
    "--label-smoothing": ("label_smoothing", float, "cross-entropy label smoothing"),
    "--scale-lr": ("scale_lr", str, "linear | sqrt | none: scale lr with batch/128"),
    "--act": ("act", str, "activation: relu, gelu, gelu-python, gelu-cpp, gelu-triton, gelu-cuda, …"),
    "--pool": ("pool", str, "max | avg"),
    "--data-dir": ("data_dir", str, "directory with the official MNIST IDX files (default: embedded MNIST)"),
    "--loader": ("loader", str, "device (whole set on the device) | dataloader"),
    "--workers": ("workers", int, "DataLoader workers (--loader dataloader)"),
    "--train-subset": ("train_subset", int, "train on the first N images"),
    "--test-subset": ("test_subset", int, "evaluate on the first N test images"),
    "--eval-batch-size": ("eval_batch_size", int, "test batch size"),
    "--device": ("device", str, "auto | cpu | cuda | cuda:N"),
    "--amp": ("amp", str, "auto (bf16 on CUDA) | bf16 | off"),
    "--channels-last": ("channels_last", str, "auto | on | off"),
    "--parallel": ("parallel", str, "none | dp | ddp | allreduce (see `trainlab dp`)"),
    "--seed": ("seed", int, "random seed"),
    "--out": ("out", str, "run directory (default runs/<name>)"),
    "--name": ("name", str, "run name"),
    "--stop-after": ("stop_after", int, "stop after N epochs as if interrupted (to try --resume)"),
}
BOOL_FLAGS = {
    "augment": "random affine augmentation on the device",
    "batchnorm": "BatchNorm variant of LeNet-5",
    "compile": "torch.compile the model",
    "progress": "progress bar within each epoch",
    "tensorboard": "write TensorBoard events",
    "gpu_telemetry": "sample GPU utilization/memory with NVML",
}


def add_train_flags(p: argparse.ArgumentParser) -> None:
    for flag, (dest, typ, help_) in TRAIN_FLAGS.items():
        p.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    for dest, help_ in BOOL_FLAGS.items():
        flag = "--" + dest.replace("_", "-")
        p.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_)
    p.add_argument("--preset", default=None, choices=sorted(PRESETS), help="default | best (BatchNorm, augmentation, 30 epochs)")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    explicit = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    cfg = TrainConfig(**explicit)
    return apply_preset(cfg, args.preset or "default", explicit=set(explicit))


def _relaunch_argv(args: argparse.Namespace) -> list[str]:
    """The `trainlab train ...` command line each torchrun worker runs (without --nproc)."""
    argv = ["train"]
    for flag, (dest, _typ, _help) in TRAIN_FLAGS.items():
        if getattr(args, dest, None) is not None:
            argv += [flag, str(getattr(args, dest))]
    for dest in BOOL_FLAGS:
        if getattr(args, dest, None) is not None:
            argv.append(("--" if getattr(args, dest) else "--no-") + dest.replace("_", "-"))
    for flag, value in (("--preset", args.preset), ("--resume", args.resume), ("--dist-timeout", args.dist_timeout)):
        if value is not None:
            argv += [flag, str(value)]
    if args.step_timing:
        argv.append("--step-timing")
    return argv


def run_train(args: argparse.Namespace) -> int:
    import os

    from trainlab.errors import ConfigError
    from trainlab.parallel.data_parallel import TIMEOUT_ENV, check_launch
    from trainlab.parallel.launch import relaunch_with_torchrun
    from trainlab.train.loop import train

    if args.dist_timeout is not None:
        if args.dist_timeout <= 0:
            raise ConfigError(f"--dist-timeout {args.dist_timeout:g}: expected a positive number of seconds")
        os.environ[TIMEOUT_ENV] = str(args.dist_timeout)  # read by every rank (torchrun passes the environment on)
    if args.resume:
        from trainlab.io import read_json
        from pathlib import Path

        saved = read_json(Path(args.resume) / "config.json")
        # A resumed run keeps its config; only flags that cannot change the result may be overridden.
        overrides = {k: getattr(args, k) for k in ("epochs", "device", "progress", "tensorboard", "gpu_telemetry")
                     if getattr(args, k, None) is not None}
        cfg = dataclasses.replace(TrainConfig.from_dict(saved), stop_after=None, **overrides)
    else:
        cfg = config_from_args(args)
    # All launch problems (mode, --nproc vs GPUs, batch vs world size) fail here, before any process starts.
    check_launch(cfg.parallel, args.nproc, cfg.device, cfg.batch_size)
    code = relaunch_with_torchrun(args.nproc, _relaunch_argv(args))
    if code is not None:
        return code
    summary = train(cfg, resume=args.resume, step_timing=args.step_timing)
    if summary.get("step_times") and int(os.environ.get("RANK", "0")) == 0:
        st = summary["step_times"]
        print(f"per step (median ms): data {st['data_ms']['median']:.2f}  compute {st['compute_ms']['median']:.2f}  "
              f"communication {st['comm_ms']['median']:.2f}{' (overlapped with backward)' if st['comm_overlapped'] else ''}")
    return 0 if summary else 1


def run_eval(args: argparse.Namespace) -> int:
    from trainlab.train.eval_checkpoint import evaluate_checkpoint

    result = evaluate_checkpoint(args.checkpoint, device=args.device, data_dir=args.data_dir)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.checkpoint}: test accuracy {result['test_accuracy']:.2f}%  test loss {result['test_loss']:.4f}  "
              f"({result['test_samples']} images, device {result['device']})")
        print("per-class accuracy: " + "  ".join(f"{c}:{a:.2f}" for c, a in enumerate(result["per_class_accuracy"])))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train LeNet-5 on MNIST", description="Train LeNet-5 on MNIST.")
    add_train_flags(p)
    p.add_argument("--resume", metavar="RUN_DIR", default=None, help="continue an interrupted run from its checkpoint")
    p.add_argument("--nproc", type=int, default=1,
                   help="processes on this node (relaunches under torchrun; with --parallel ddp|allreduce)")
    p.add_argument("--dist-timeout", type=float, default=None, metavar="S",
                   help="process-group timeout: a dead or hung rank fails the others after S seconds (default 120)")
    p.add_argument("--step-timing", action="store_true", help="split each step into data / compute / communication time")
    p.set_defaults(func=run_train)

    e = subparsers.add_parser("eval", help="re-evaluate a checkpoint on the test set")
    e.add_argument("checkpoint", help="checkpoint.pt or its run directory")
    e.add_argument("--device", default="auto")
    e.add_argument("--data-dir", default=None)
    e.add_argument("--json", action="store_true", help="print JSON")
    e.set_defaults(func=run_eval)
