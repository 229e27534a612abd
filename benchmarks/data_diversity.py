"""Data diversity vs batch size (the first notes' discussion): does a larger global batch help per step?

    python benchmarks/data_diversity.py [--batches 16,64,256,1024] [--steps 100] [--size 16384] [--distinct 1024]

Two training sets of the same size (--size images) from MNIST's training set: `diverse`, that many
distinct images, and `repeated`, --distinct images each repeated size/distinct times. At each global
batch size, LeNet-5 trains the same number of steps (Adam, constant lr, the same seed and init) on each
set, and the test accuracy (on --test images) is recorded every --eval-every steps: accuracy/step
curves. A batch drawn from the repeated set holds at most --distinct different images however large
it grows, so from some batch size on it brings no new information per step; the diverse set keeps
giving each larger batch new images. This is a benchmark's own small loop around trainlab's training
step (no checkpoints or run directories): the quantity of interest is accuracy per optimizer step, nothing else.
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import add_output_args, check_output, save

from trainlab.data.datasets import load_dataset
from trainlab.data.mnist import normalize
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.plan import resolve
from trainlab.lenet.setup import build_model, build_optimizer
from trainlab.lenet.step import make_step


@torch.no_grad()
def accuracy(model, x, y) -> float:
    model.eval()
    correct = sum(int((model(x[i : i + 2000]).argmax(1) == y[i : i + 2000]).sum()) for i in range(0, len(y), 2000))
    model.train()
    return 100.0 * correct / len(y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="16,64,256,1024")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--size", type=int, default=16384, help="images in each training set")
    ap.add_argument("--distinct", type=int, default=1024, help="distinct images in the repeated set")
    ap.add_argument("--test", type=int, default=2000, help="test images scored at each evaluation")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--name", default="data_diversity")
    add_output_args(ap)
    args = ap.parse_args()
    out = check_output(args.out, args.name, force=args.force)
    torch.set_num_threads(args.threads)
    if args.size % args.distinct:
        raise SystemExit(f"--size {args.size} must be a multiple of --distinct {args.distinct}")

    data = load_dataset(args.dataset)
    x_all = normalize(torch.from_numpy(data.train_images[: args.size])).unsqueeze(1)
    y_all = torch.from_numpy(data.train_labels[: args.size]).long()
    x_test = normalize(torch.from_numpy(data.test_images[: args.test])).unsqueeze(1)
    y_test = torch.from_numpy(data.test_labels[: args.test]).long()
    sets = {
        "diverse": torch.arange(args.size),
        "repeated": torch.arange(args.distinct).repeat(args.size // args.distinct),
    }  # same size, fewer distinct
    batches = [int(b) for b in args.batches.split(",")]
    # trainlab's step (lenet.step) with this benchmark's recipe: Adam at a constant lr, no weight decay, fp32
    plan = resolve(
        TrainConfig(
            model=args.model,
            optimizer="adam",
            lr=args.lr,
            weight_decay=0.0,
            schedule="constant",
            amp="off",
            channels_last="off",
            device="cpu",
            seed=args.seed,
        ),
        torch.device("cpu"),
    )
    rows, log_lines = [], []
    for batch in batches:
        for name, index in sets.items():  # interleaved: the two sets of one batch size run back to back
            model = build_model(plan)  # seeded: the same initial weights in every run
            train_step = make_step(plan, model, build_optimizer(plan, model))
            g = torch.Generator().manual_seed(args.seed)
            order, pos, curve, distinct_seen = torch.randperm(len(index), generator=g), 0, [], set()
            t0 = time.perf_counter()
            for step in range(1, args.steps + 1):
                if pos + batch > len(order):  # a new epoch over the set: reshuffle
                    order, pos = torch.randperm(len(index), generator=g), 0
                rows_ = index[order[pos : pos + batch]]
                pos += batch
                distinct_seen.update(rows_.tolist())
                loss, _ = train_step(x_all[rows_], y_all[rows_])
                if step % args.eval_every == 0 or step == 1:
                    curve.append(
                        {
                            "step": step,
                            "test_accuracy": accuracy(model, x_test, y_test),
                            "train_loss": loss.item(),
                            "distinct_images_seen": len(distinct_seen),
                        }
                    )
            seconds = time.perf_counter() - t0
            line = (
                f"batch {batch:>5}  {name:<8}  "
                + "  ".join(f"s{c['step']}:{c['test_accuracy']:.1f}" for c in curve)
                + f"  ({len(distinct_seen)} distinct images seen, {seconds:.1f} s)"
            )
            print(line, flush=True)
            log_lines.append(line)
            rows.append(
                {
                    "batch_size": batch,
                    "set": name,
                    "curve": curve,
                    "seconds": seconds,
                    "final_test_accuracy": curve[-1]["test_accuracy"],
                    "distinct_images_seen": len(distinct_seen),
                }
            )

    md = [
        f"{args.model} on {args.dataset}: {args.steps} Adam steps (lr {args.lr:g}, constant) per run; `diverse` = {args.size} "
        f"distinct training images, `repeated` = {args.distinct} distinct images × {args.size // args.distinct} "
        f"(same size). Test accuracy (%) on {args.test} test images. Seed {args.seed}; one run per cell.",
        "",
        "| global batch | set | "
        + " | ".join(f"step {c['step']}" for c in rows[0]["curve"])
        + " | distinct images seen |",
        "|---:|---|" + "---:|" * len(rows[0]["curve"]) + "---:|",
    ]
    for r in rows:
        md.append(
            f"| {r['batch_size']} | {r['set']} | "
            + " | ".join(f"{c['test_accuracy']:.1f}" for c in r["curve"])
            + f" | {r['distinct_images_seen']:,} |"
        )
    md += [
        "",
        "Final test accuracy after the same number of steps, by batch size:",
        "",
        "| global batch | diverse | repeated | diverse − repeated |",
        "|---:|---:|---:|---:|",
    ]
    for b in batches:
        d, r = (
            next(x["final_test_accuracy"] for x in rows if x["batch_size"] == b and x["set"] == s)
            for s in ("diverse", "repeated")
        )
        md.append(f"| {b} | {d:.1f} | {r:.1f} | {d - r:+.1f} |")
    save(args.name, rows, "\n".join(md) + "\n", log_lines, device="cpu", out=out)


if __name__ == "__main__":
    main()
