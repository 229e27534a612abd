"""LeNet-5 from our operators vs ATen's: epoch time and test accuracy, full MNIST, one process, interleaved.

    python benchmarks/ops_lenet_epoch.py                       # aten, own (= own=cpp), own=python; 5 epochs
    python benchmarks/ops_lenet_epoch.py --ops aten,own --epochs 3 --threads 2 --name ops_lenet_epoch_2threads

Each variant is a real `trainlab train --ops VARIANT` run (the default recipe: batch 256, OneCycle
AdamW, seed 0, full 60k/10k MNIST), but the runs advance one epoch at a time in turn — epoch 1 of
every variant, then epoch 2, … (with --stop-after 1 and --resume, in this process), and the order
of the variants rotates each epoch — so a change in machine load hits all variants alike. Epoch
times are the loop's own `epoch_seconds` (training only: no evaluation, checkpointing or start-up).

Reports per variant: final test accuracy and its difference to ATen's (goal: within 0.15 points),
epoch time median and spread, and the median of the per-epoch ratios to ATen's epoch (goal for
`own`: <= 1.5x). Writes benchmarks/results/<name>.{json,md,log}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from _common import add_output_args, check_output, save

from trainlab.io import read_json
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train
from trainlab.lenet.model import parse_ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="aten,own,own=python", help="comma-separated variants (the first is the baseline)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--train-subset", type=int, default=None, help="a shorter epoch, for a smoke run")
    ap.add_argument("--name", default="ops_lenet_epoch", help="results file stem: <out>/<name>.{json,md,log}")
    add_output_args(ap)
    args = ap.parse_args()
    check_output(args.out, args.name, force=args.force)
    variants = [v.strip() for v in args.ops.split(",") if v.strip()]
    for v in variants:
        parse_ops(v)
    if args.threads:
        torch.set_num_threads(args.threads)

    log_lines: list[str] = []

    def log(*parts, **_kw):
        line = " ".join(str(p) for p in parts)
        log_lines.append(line)
        print(line, flush=True)

    runs = Path(tempfile.mkdtemp(prefix="ops_lenet_epoch_"))
    run_dir = {v: runs / v.replace("=", "_") for v in variants}
    for epoch in range(args.epochs):
        order = variants[epoch % len(variants) :] + variants[: epoch % len(variants)]
        for v in order:
            cfg = TrainConfig(
                ops=v,
                epochs=args.epochs,
                seed=args.seed,
                device=args.device,
                train_subset=args.train_subset,
                progress=False,
                tensorboard=False,
                stop_after=1,
                out=str(run_dir[v]),
            )
            log(f"== {v}: epoch {epoch + 1}/{args.epochs}")
            train(cfg, resume=run_dir[v] if epoch else None, log=log)

    rows = []
    base = read_json(run_dir[variants[0]] / "summary.json")
    base_epochs = epoch_seconds(run_dir[variants[0]])
    for v in variants:
        summary = read_json(run_dir[v] / "summary.json")
        epochs = epoch_seconds(run_dir[v])
        ratios = [e / b for e, b in zip(epochs, base_epochs)]
        rows.append(
            {
                "ops": v,
                "test_accuracy": summary["test_accuracy"],
                "accuracy_diff_vs_baseline": summary["test_accuracy"] - base["test_accuracy"],
                "epoch_s_median": statistics.median(epochs),
                "epoch_s_min": min(epochs),
                "epoch_s_max": max(epochs),
                "epoch_s": epochs,
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "threads": torch.get_num_threads(),
                "epochs": args.epochs,
            }
        )
    lines = [
        f"| ops | test acc (%) | Δ vs {variants[0]} (points) | epoch s, median [min–max] | × {variants[0]} epoch, median of "
        "per-epoch ratios [min–max] |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['ops']} | {r['test_accuracy']:.2f} | {r['accuracy_diff_vs_baseline']:+.2f} | "
            f"{r['epoch_s_median']:.2f} [{r['epoch_s_min']:.2f}–{r['epoch_s_max']:.2f}] | "
            f"{r['ratio_median']:.2f} [{r['ratio_min']:.2f}–{r['ratio_max']:.2f}] |"
        )
    table = "\n".join(lines)
    print(table)
    note = (
        f"{args.epochs} epochs per variant, epochs interleaved across variants (rotating order), seed {args.seed}, "
        f"device {args.device}, torch threads {torch.get_num_threads()}"
    )
    save(
        args.name,
        rows,
        f"# LeNet-5: our operators vs ATen, full MNIST\n\n{note}\n\n{table}\n",
        log_lines + ["", table],
        out=args.out,
    )


def epoch_seconds(run_dir: Path) -> list[float]:
    """The loop's own per-epoch training time, from the run's metrics.jsonl."""
    return [
        json.loads(line)["epoch_seconds"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]


if __name__ == "__main__":
    main()
