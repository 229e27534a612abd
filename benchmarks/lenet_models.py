"""Architectures compared (the second report's linear / one-conv / LeNet study): `trainlab sweep --model …`
over seeds, then per model its parameters, forward FLOPs per image, final train and test accuracy,
the train–test gap per epoch (overfitting), and the training time, as mean ± sd over seeds.

    python benchmarks/lenet_models.py --models linear,mlp,one-conv,lenet5,lenet5-bn --seeds 2 \
        --epochs 15 --train-subset 10000 [--dataset mnist] [--device cpu]

The runs are ordinary sweep run directories (--runs-dir, default runs/lenet_models), so
`trainlab report RUNS_DIR` draws the same comparison; this script adds the table and the per-epoch
gap curves. A smaller training set (--train-subset) makes overfitting visible within a few epochs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from _common import add_output_args, check_output, save

from trainlab.io import read_json
from trainlab.lenet.sweep import SweepConfig, run_sweep


def _mean_sd(xs: list[float]) -> tuple[float, float | None]:
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else None


def _pm(xs: list[float], digits: int = 2) -> str:
    m, sd = _mean_sd(xs)
    return f"{m:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="linear,mlp,one-conv,lenet5,lenet5-bn")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--train-subset", type=int, default=10000)
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs-dir", default="runs/lenet_models", help="where the sweep's run directories go")
    ap.add_argument("--name", default="lenet_models", help="result file stem")
    add_output_args(ap)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: on a shared machine more threads than free cores spin and slow the run down)",
    )
    args = ap.parse_args()
    out = check_output(args.out, args.name, force=args.force)
    torch.set_num_threads(args.threads)

    models = args.models.split(",")
    values = {
        "model": models,
        "epochs": [args.epochs],
        "train_subset": [args.train_subset],
        "dataset": [args.dataset],
        "device": [args.device],
        "tensorboard": [False],
    }
    log_lines: list[str] = []

    def log(line: str | None) -> None:
        if line:
            print(line, flush=True)
            log_lines.append(line)

    sweep_cmd = (
        f"trainlab sweep --model {args.models} --seeds {args.seeds} --epochs {args.epochs} "
        f"--train-subset {args.train_subset} --dataset {args.dataset} --device {args.device} --no-tensorboard "
        f"--out {args.runs_dir}"
    )
    log(f"$ {sweep_cmd}")
    failed = run_sweep(
        values, SweepConfig(out=args.runs_dir, seeds=args.seeds, gpus="none"), command=sweep_cmd, log=log
    )
    if failed:
        raise SystemExit(f"{failed} run(s) failed; see the log above")

    rows = []
    for model in models:
        runs = sorted(Path(args.runs_dir).glob(f"model={model}_seed=*"))
        summaries = [read_json(r / "summary.json") for r in runs]
        histories = [
            [json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines() if line.strip()] for r in runs
        ]
        epochs = min(len(h) for h in histories)
        curve = {
            key: [statistics.mean(h[e][key] for h in histories) for e in range(epochs)]
            for key in ("train_accuracy", "test_accuracy", "train_test_gap", "train_loss", "test_loss")
        }
        rows.append(
            {
                "model": model,
                "seeds": len(runs),
                "params": summaries[0]["params"],
                "flops_per_image": summaries[0]["flops_per_image"],
                "test_accuracy": _mean_sd([s["test_accuracy"] for s in summaries]),
                "train_accuracy": _mean_sd([h[-1]["train_accuracy"] for h in histories]),
                "gap": _mean_sd([h[-1]["train_test_gap"] for h in histories]),
                "best_test_epoch": max(range(epochs), key=lambda e: curve["test_accuracy"][e]) + 1,
                "min_test_loss_epoch": min(range(epochs), key=lambda e: curve["test_loss"][e]) + 1,
                "train_seconds": _mean_sd([s["train_seconds"] for s in summaries]),
                "curves_mean_over_seeds": curve,
                "_raw": {
                    "test": [s["test_accuracy"] for s in summaries],
                    "train": [h[-1]["train_accuracy"] for h in histories],
                    "gap": [h[-1]["train_test_gap"] for h in histories],
                    "sec": [s["train_seconds"] for s in summaries],
                },
            }
        )

    md = [
        f"Models on {args.dataset}, {args.train_subset} training images, {args.epochs} epochs, {args.seeds} seeds "
        f"(mean ± sd), device {args.device}, {args.threads} thread(s). Gap = running train accuracy − test accuracy (points). Loaded box: times are noisy.",
        "",
        "| model | params | forward MFLOP/image | test acc (%) | train acc (%) | gap (points) | best test epoch | "
        "min test-loss epoch | train time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        raw = r["_raw"]
        md.append(
            f"| {r['model']} | {r['params']:,} | {r['flops_per_image'] / 1e6:.2f} | {_pm(raw['test'])} | {_pm(raw['train'])} | "
            f"{_pm(raw['gap'])} | {r['best_test_epoch']} | {r['min_test_loss_epoch']} | {_pm(raw['sec'], 1)} |"
        )
    epochs = min(len(r["curves_mean_over_seeds"]["train_test_gap"]) for r in rows)
    md += [
        "",
        "Train–test gap per epoch (points, mean over seeds):",
        "",
        "| epoch | " + " | ".join(r["model"] for r in rows) + " |",
        "|---:|" + "---:|" * len(rows),
    ]
    for e in range(epochs):
        md.append(
            f"| {e + 1} | "
            + " | ".join(f"{r['curves_mean_over_seeds']['train_test_gap'][e]:+.2f}" for r in rows)
            + " |"
        )
    md += [
        "",
        "Test loss per epoch (mean over seeds):",
        "",
        "| epoch | " + " | ".join(r["model"] for r in rows) + " |",
        "|---:|" + "---:|" * len(rows),
    ]
    for e in range(epochs):
        md.append(
            f"| {e + 1} | " + " | ".join(f"{r['curves_mean_over_seeds']['test_loss'][e]:.4f}" for r in rows) + " |"
        )
    for r in rows:
        r.pop("_raw")
    save(args.name, rows, "\n".join(md) + "\n", log_lines, device=args.device, out=out)


if __name__ == "__main__":
    main()
