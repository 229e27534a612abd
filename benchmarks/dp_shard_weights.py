"""Devices of unequal speed: DDP over 2 CPU ranks, one slowed artificially, with even shards vs
`--shard-weights auto`, against the ideal bound N / (t_0 + t_1) per epoch (t_r: rank r's own
throughput, measured by `auto` in the first steps).

    python benchmarks/dp_shard_weights.py [--slow 3] [--train-subset 8192] [--epochs 2] [--repeats 2]

TRAINLAB_SLOW_RANKS=1:<slow> makes rank 1 that many times slower (lenet/shard_weights.py: it sleeps
after each training forward pass, leaving its core to the other rank, like a slower device). Each rank
runs 1 thread. The runs alternate (even, auto, even, auto, …) so a change in the machine's load hits
both. Also checked: the per-step losses of both splits agree (the weighting keeps them exact).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import add_output_args, check_output, save

from trainlab.io import read_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slow", type=float, default=3.0, help="rank 1's slowdown factor")
    ap.add_argument("--train-subset", type=int, default=8192)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--name", default="dp_shard_weights")
    add_output_args(ap)
    args = ap.parse_args()
    out = check_output(args.out, args.name, force=args.force)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINLAB_SLOW_RANKS": f"1:{args.slow:g}"}
    base = [
        sys.executable,
        "-m",
        "trainlab",
        "train",
        "--model",
        args.model,
        "--parallel",
        "ddp",
        "--nproc",
        "2",
        "--device",
        "cpu",
        "--train-subset",
        str(args.train_subset),
        "--test-subset",
        "1000",
        "--epochs",
        str(args.epochs),
        "--batch-size",
        str(args.batch_size),
        "--no-progress",
        "--no-tensorboard",
    ]
    runs, log_lines = [], []
    with tempfile.TemporaryDirectory(prefix="shard_weights_") as tmp:
        for rep in range(args.repeats):
            for split, extra in (("even", []), ("auto", ["--shard-weights", "auto"])):
                run_dir = Path(tmp) / f"{split}{rep}"
                cmd = base + extra + ["--out", str(run_dir)]
                shown = f"OMP_NUM_THREADS=1 TRAINLAB_SLOW_RANKS=1:{args.slow:g} trainlab " + " ".join(cmd[3:-2])
                print(f"$ {shown}", flush=True)
                log_lines.append(f"$ {shown}")
                proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                lines = [
                    ln for ln in proc.stdout.splitlines() if "OMP_NUM_THREADS" not in ln and not ln.startswith("*****")
                ]
                log_lines += lines
                print("\n".join(ln for ln in lines if ln.startswith(("epoch", "done", "shard"))), flush=True)
                if proc.returncode:
                    raise SystemExit(f"{split}: exit {proc.returncode}")
                s = read_json(run_dir / "summary.json")
                hist = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
                runs.append(
                    {
                        "split": split,
                        "repeat": rep,
                        "epoch_seconds": [h["epoch_seconds"] for h in hist],
                        "step_losses": [x for h in hist for x in h["step_losses"]],
                        "test_accuracy": s["test_accuracy"],
                        "shard_weights": s["shard_weights"],
                    }
                )
    n = args.train_subset
    auto = [r for r in runs if r["split"] == "auto"]
    even = [r for r in runs if r["split"] == "even"]
    rates = [r["shard_weights"]["measured_images_per_s"] for r in auto]
    ideal = [n / sum(t) for t in rates]  # an epoch if both ranks ran flat out on proportional shares
    med = lambda runs_: statistics.median(x for r in runs_ for x in r["epoch_seconds"])  # noqa: E731
    loss_diff = max(abs(a - b) for r in auto for e in even for a, b in zip(r["step_losses"], e["step_losses"]))
    summary = {
        "even_epoch_s": med(even),
        "auto_epoch_s": med(auto),
        "ideal_epoch_s": statistics.median(ideal),
        "slow_bound_epoch_s": statistics.median(n / (2 * min(t)) for t in rates),
        "max_step_loss_difference": loss_diff,
    }
    summary["auto_over_ideal"] = summary["auto_epoch_s"] / summary["ideal_epoch_s"]
    summary["even_over_auto"] = summary["even_epoch_s"] / summary["auto_epoch_s"]
    md = [
        f"{args.model}, DDP over 2 CPU ranks × 1 thread, rank 1 slowed {args.slow:g}× (TRAINLAB_SLOW_RANKS), {n} training images, "
        f"global batch {args.batch_size}, {args.epochs} epochs, {args.repeats} alternating repeats. Loaded shared box.",
        "",
        "| split | epoch time (s, median) | rows per global batch |",
        "|---|---:|---|",
        f"| even | {summary['even_epoch_s']:.2f} | {args.batch_size // 2}, {args.batch_size - args.batch_size // 2} |",
    ]
    shares = auto[0]["shard_weights"]["shares"]
    rows0 = round(args.batch_size * shares[0] / sum(shares))
    md += [
        f"| auto (measured {', '.join(f'{t:,.0f}' for t in rates[0])} img/s) | {summary['auto_epoch_s']:.2f} | "
        f"{rows0}, {args.batch_size - rows0} (first repeat) |",
        f"| ideal bound N / (t0 + t1) | {summary['ideal_epoch_s']:.2f} | |",
        f"| even-split bound N / (2 · min t) | {summary['slow_bound_epoch_s']:.2f} | |",
        "",
        f"Weighted vs even: {summary['even_over_auto']:.2f}× faster; weighted epoch = {summary['auto_over_ideal']:.2f}× the ideal bound. "
        f"Largest per-step loss difference between the even and weighted runs: {loss_diff:.2e}.",
    ]
    save(args.name, {"runs": runs, **summary}, "\n".join(md) + "\n", log_lines, device="cpu", out=out)


if __name__ == "__main__":
    main()
