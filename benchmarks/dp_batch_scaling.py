"""Test accuracy vs global batch size, with and without scaling the learning rate (`--scale-lr`).

    python benchmarks/dp_batch_scaling.py --batches 128,256,512,1024,2048,4096 --scales none,linear,sqrt \
        --epochs 2 --optimizer sgd --lr 0.05 --warmup-epochs 0.5 [--threads 1]

Data parallelism over W devices at a fixed per-device batch multiplies the global batch by W. The
question: does the learning rate have to follow (Goyal et al. 2017: linear scaling + warm-up; the
square-root rule for adaptive optimizers), and how far does it carry? Every run uses the same seed,
data order and number of epochs, so a larger batch also means proportionally fewer optimizer steps.
Accuracy does not depend on CPU contention, so this runs on the shared box in the background.
Results (json/md/log) are rewritten after every run, so a partial sweep is still on disk.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from _common import add_output_args, check_output, save

from trainlab.lenet.config import TrainConfig
from trainlab.lenet.setup import scaled_lr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="128,256,512,1024,2048,4096")
    ap.add_argument("--scales", default="none,linear,sqrt")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--lr", type=float, default=0.05, help="learning rate at the reference batch of 128")
    ap.add_argument("--schedule", default="cosine")
    ap.add_argument("--warmup-epochs", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: leave the shared cores to others)")
    ap.add_argument("--name", default="dp_batch_scaling")
    add_output_args(ap)
    args = ap.parse_args()
    check_output(args.out, args.name, force=args.force)
    torch.set_num_threads(args.threads)
    from trainlab.lenet.loop import train

    rows, lines = [], []
    for batch in [int(b) for b in args.batches.split(",")]:
        for scale in args.scales.split(","):
            cfg = TrainConfig(
                batch_size=batch,
                scale_lr=scale,
                epochs=args.epochs,
                optimizer=args.optimizer,
                lr=args.lr,
                schedule=args.schedule,
                warmup_epochs=args.warmup_epochs,
                seed=args.seed,
                device=args.device,
                progress=False,
                tensorboard=False,
                gpu_telemetry=False,
            )
            same = next((r for r in rows if r["global_batch"] == batch and r["lr"] == scaled_lr(cfg)), None)
            if same is not None:  # at the reference batch every rule gives the same lr: the same run
                rows.append({**same, "scale_lr": scale})
                continue
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as d:
                cfg.out = d
                s = train(cfg, log=lambda line: lines.append(line) if line.startswith(("epoch", "done")) else None)
            acc = s["test_accuracy"]
            row = {
                "global_batch": batch,
                "scale_lr": scale,
                "lr": scaled_lr(cfg),
                "optimizer": args.optimizer,
                "schedule": args.schedule,
                "warmup_epochs": args.warmup_epochs,
                "epochs": args.epochs,
                "steps": s["epochs"] * (60_000 // batch + (60_000 % batch > 0)),
                "test_accuracy": acc,
                "test_loss": s["test_loss"],
                "train_seconds": s["train_seconds"],
            }
            rows.append(row)
            line = (
                f"batch {batch:>5}  scale {scale:<6}  lr {row['lr']:.4g}  steps {row['steps']:>4}  "
                f"test_acc {acc:6.2f}%  test_loss {s['test_loss']:.4f}  ({time.perf_counter() - t0:.0f} s)"
            )
            print(line, flush=True)
            lines.append(line)
            save(args.name, rows, markdown(rows), lines, device=args.device, out=args.out)


def markdown(rows: list[dict]) -> str:
    scales = list(dict.fromkeys(r["scale_lr"] for r in rows))
    batches = list(dict.fromkeys(r["global_batch"] for r in rows))
    by = {(r["global_batch"], r["scale_lr"]): r for r in rows}
    head = "| global batch | " + " | ".join(f"{s}: lr → test acc (%)" for s in scales) + " |"
    out = [head, "| ---: |" + " ---: |" * len(scales)]
    for b in batches:
        cells = [f"{by[b, s]['lr']:.3g} → {by[b, s]['test_accuracy']:.2f}" if (b, s) in by else "…" for s in scales]
        out.append(f"| {b} | " + " | ".join(cells) + " |")
    r0 = rows[0]
    out.append(
        f"\n{r0['optimizer']}, {r0['schedule']} schedule with {r0['warmup_epochs']} warm-up epochs, {r0['epochs']} epochs, "
        "seed 0, full MNIST training set, test accuracy on the 10k test set."
    )
    return "\n".join(out)


if __name__ == "__main__":
    main()
