"""ResNet-18 (CIFAR form, 1 input channel) on Fashion-MNIST: 1 process vs DDP over 2 processes (the
notes' multi-GPU experiment), with test accuracy, images/s and the speed-up.

    python benchmarks/resnet18_fmnist_ranks.py [--device cpu] [--train-subset 1024] [--epochs 2]

On a GPU machine run it with --device cuda and the full set (--train-subset 0, --epochs 10: the notes
reach ≈ 0.91-0.93 test accuracy). On a CPU a training image costs ~2.7 GFLOP (3 × the 0.91 GFLOP
forward pass), so the default shrinks the run to a subset and 2 epochs: its accuracy is what that
subset reaches, not the notes' figure. Each process gets --threads threads (default 1: one core stands for one
device, and on a shared, loaded machine a process with more threads than free cores loses far more to
spinning threads than it gains; measured here: LeNet-5 at 2 threads ran at 1/5 of its 1-thread speed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import add_output_args, check_output, save

from trainlab.io import read_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--train-subset", type=int, default=1024, help="0 = the whole training set")
    ap.add_argument("--test-subset", type=int, default=1000, help="0 = the whole test set")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every process (CPU)")
    ap.add_argument("--name", default="resnet18_fmnist_ranks")
    add_output_args(ap)
    args = ap.parse_args()
    out = check_output(args.out, args.name, force=args.force)
    base = [
        sys.executable,
        "-m",
        "trainlab",
        "train",
        "--model",
        "resnet18",
        "--dataset",
        "fashion-mnist",
        "--device",
        args.device,
        "--epochs",
        str(args.epochs),
        "--batch-size",
        str(args.batch_size),
        "--no-progress",
        "--no-tensorboard",
    ]
    base += ["--train-subset", str(args.train_subset)] if args.train_subset else []
    base += ["--test-subset", str(args.test_subset)] if args.test_subset else []
    rows, log_lines = [], []
    with tempfile.TemporaryDirectory(prefix="resnet18_ranks_") as tmp:
        for label, extra, threads in (
            ("1 process", [], args.threads),
            ("DDP, 2 processes", ["--parallel", "ddp", "--nproc", "2"], args.threads),
        ):
            cmd = base + extra + ["--out", f"{tmp}/{len(rows)}"]
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if args.device == "cpu" else dict(os.environ)
            shown = f"OMP_NUM_THREADS={threads} " * (args.device == "cpu") + " ".join(["trainlab", *cmd[3:]])
            print(f"$ {shown}", flush=True)
            log_lines.append(f"$ {shown}")
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            lines = [
                ln for ln in proc.stdout.splitlines() if "OMP_NUM_THREADS" not in ln and not ln.startswith("*****")
            ]
            log_lines += lines
            print("\n".join(lines[-4:]), flush=True)
            if proc.returncode:
                raise SystemExit(f"{label}: exit {proc.returncode}")
            s = read_json(Path(tmp) / str(len(rows)) / "summary.json")
            history = [
                json.loads(x) for x in (Path(tmp) / str(len(rows)) / "metrics.jsonl").read_text().splitlines() if x
            ]
            rows.append(
                {
                    "run": label,
                    "world_size": s["world_size"],
                    "threads_per_process": threads if args.device == "cpu" else None,
                    "test_accuracy": s["test_accuracy"],
                    "train_seconds": s["train_seconds"],
                    "images_per_s_median": s["images_per_s_median"],
                    "images_per_s_per_epoch": [h["images_per_s"] for h in history],
                    "test_accuracy_per_epoch": [h["test_accuracy"] for h in history],
                    "params": s["params"],
                    "flops_per_image": s["flops_per_image"],
                }
            )
    speedup = rows[1]["images_per_s_median"] / rows[0]["images_per_s_median"]
    subset = f"{args.train_subset} training images" if args.train_subset else "the full training set"
    md = [
        f"ResNet-18 (CIFAR form, {rows[0]['params']:,} parameters, {rows[0]['flops_per_image'] / 1e9:.2f} GFLOP forward per image) "
        f"on Fashion-MNIST, {subset}, {args.epochs} epochs, global batch {args.batch_size}, device {args.device}"
        + (
            " (shrunk for a CPU: accuracy is this subset's, not the notes' 10-epoch ≈ 0.91-0.93)"
            if args.train_subset
            else ""
        )
        + ". Loaded shared box: other jobs ran on the same cores.",
        "",
        "| run | processes × threads | test accuracy (%) | images/s (median epoch) | train time (s) |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['run']} | {r['world_size']} × {r['threads_per_process']} | {r['test_accuracy']:.2f} | "
            f"{r['images_per_s_median']:,.1f} | {r['train_seconds']:.1f} |"
        )
    md += ["", f"Speed-up of 2 processes over 1: {speedup:.2f}×."]
    save(args.name, {"rows": rows, "speedup": speedup}, "\n".join(md) + "\n", log_lines, device=args.device, out=out)


if __name__ == "__main__":
    main()
