"""One-epoch recipe ablation: what each lever buys in accuracy after ONE epoch and in step cost.

Every variant is the `fast` preset with one epoch and a few fields changed. By default each trains on
the first 50,000 training images and is scored on the last 10,000 (`--holdout 10000`): recipes are
compared on a validation split, never on the test set. `--holdout 0` trains on all 60,000 and reports
the test set: that is for the chosen recipe, once. For each seed the variants run back to back, so a
busy neighbour slows them alike; images/s is the training throughput of that epoch (loaded-box figures
are ratios between rows of one run, not absolutes).

    python benchmarks/lenet_recipe_ablation.py --seeds 0,1                        # the validation screen
    python benchmarks/lenet_recipe_ablation.py --seeds 0,1,2,3,4 --variants base,fast --holdout 0 --name lenet_recipe_test

Screens can run as separate processes (one core each, `--threads 1 --name part_a`) and be merged into one
table afterwards, in the order of --variants: `--merge part_a,part_b --name lenet_recipe_ablation`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from _common import add_output_args, check_output, save

from trainlab.io import read_json
from trainlab.lenet.config import TrainConfig, apply_preset
from trainlab.lenet.loop import train

# The `fast` preset as it stood before issue 23 (2 epochs), cut to one epoch: the row the others change.
OLD_FAST = dict(
    batchnorm=True,
    batchnorm_conv1=False,
    lr=1e-2,
    label_smoothing=0.1,
    amp="bf16",
    channels_last="on",
    schedule="onecycle",
)
VARIANTS: dict[str, tuple[str, dict]] = {
    "base": ("old `fast` (OneCycle peak 1e-2, batch 256, BN conv2–fc2, LS 0.1), 1 epoch", {}),
    "lr2e-2": ("peak lr 2e-2", dict(lr=2e-2)),
    "lr5e-3": ("peak lr 5e-3", dict(lr=5e-3)),
    "nols": ("no label smoothing", dict(label_smoothing=0.0)),
    "bn1": ("BatchNorm after conv1 too", dict(batchnorm_conv1=True)),
    "nobn": ("no BatchNorm", dict(batchnorm=False)),
    "linear": ("linear warm-up 0.2 epoch, linear decay to 0", dict(schedule="linear", warmup_epochs=0.2)),
    "linear-lr2e-2": ("linear warm-up/decay, peak 2e-2", dict(schedule="linear", warmup_epochs=0.2, lr=2e-2)),
    "b128": ("batch 128", dict(batch_size=128)),
    "b128-linear": ("batch 128, linear warm-up/decay", dict(batch_size=128, schedule="linear", warmup_epochs=0.2)),
    "b512": ("batch 512, peak 2e-2", dict(batch_size=512, lr=2e-2)),
    "linear-lr15e-3": ("linear warm-up/decay, peak 1.5e-2", dict(schedule="linear", warmup_epochs=0.2, lr=1.5e-2)),
    "linear-wu0.1": ("linear warm-up 0.1 epoch/decay", dict(schedule="linear", warmup_epochs=0.1)),
    "linear-ls0.2": (
        "linear warm-up/decay, label smoothing 0.2",
        dict(schedule="linear", warmup_epochs=0.2, label_smoothing=0.2),
    ),
    "b512-linear-lr2e-2": (
        "batch 512, linear warm-up/decay, peak 2e-2",
        dict(batch_size=512, schedule="linear", warmup_epochs=0.2, lr=2e-2),
    ),
    "b512-linear-lr3e-2": (
        "batch 512, linear warm-up/decay, peak 3e-2",
        dict(batch_size=512, schedule="linear", warmup_epochs=0.2, lr=3e-2),
    ),
    "bw128-b512": (
        "batch 128 for the first ¼ epoch, then 512; linear, peak 2e-2",
        dict(
            warmup_batch_size=128,
            batch_warmup_epochs=0.25,
            batch_size=512,
            schedule="linear",
            warmup_epochs=0.1,
            lr=2e-2,
        ),
    ),
    "bw64-b512": (
        "batch 64 for the first ¼ epoch, then 512; linear, peak 2e-2",
        dict(
            warmup_batch_size=64,
            batch_warmup_epochs=0.25,
            batch_size=512,
            schedule="linear",
            warmup_epochs=0.1,
            lr=2e-2,
        ),
    ),
    "bw128-b256": (
        "batch 128 for the first ½ epoch, then 256; linear, peak 1e-2",
        dict(warmup_batch_size=128, batch_warmup_epochs=0.5, schedule="linear", warmup_epochs=0.1),
    ),
    "bw64-b256": (
        "batch 64 for the first ¼ epoch, then 256; linear, peak 1e-2",
        dict(warmup_batch_size=64, batch_warmup_epochs=0.25, schedule="linear", warmup_epochs=0.1),
    ),
    "b128-linear-lr2e-2": (
        "batch 128, linear warm-up/decay, peak 2e-2",
        dict(batch_size=128, schedule="linear", warmup_epochs=0.2, lr=2e-2),
    ),
    "b128-linear-lr5e-3": (
        "batch 128, linear warm-up/decay, peak 5e-3",
        dict(batch_size=128, schedule="linear", warmup_epochs=0.2, lr=5e-3),
    ),
    "b128-linear-lr3e-2": (
        "batch 128, linear warm-up/decay, peak 3e-2 (= the new `fast` preset)",
        dict(batch_size=128, schedule="linear", warmup_epochs=0.2, lr=3e-2),
    ),
    "ema": ("EMA of the weights 0.99", dict(ema=0.99)),
    "wd0": ("no weight decay", dict(weight_decay=0.0)),
    "fp32": ("fp32 NCHW (no bf16, no channels-last)", dict(amp="off", channels_last="off")),
    "fast": ("the new `fast` preset, one epoch", None),
    # changes to the `fast` preset itself (fields applied on top of it, not on the old one)
    "fast-aten": (
        "`fast` on PyTorch's layers (conv1 in bf16, not our fused fp32 first stage)",
        {"_on_fast": True, "ops": "aten"},
    ),
    "fast-b96": ("`fast` with batch 96", {"_on_fast": True, "batch_size": 96}),
    "fast-lr4e-2": ("`fast` with peak lr 4e-2", {"_on_fast": True, "lr": 4e-2}),
    "fast-ls0.05": ("`fast` with label smoothing 0.05", {"_on_fast": True, "label_smoothing": 0.05}),
    "fast-wu0.3": ("`fast` with a 0.3-epoch warm-up", {"_on_fast": True, "warmup_epochs": 0.3}),
    "fast-fp32": ("`fast` without bf16 autocast", {"_on_fast": True, "amp": "off"}),
}


def run(name: str, seed: int, holdout: int | None) -> dict:
    _, fields = VARIANTS[name]
    with tempfile.TemporaryDirectory() as d:
        base = TrainConfig(device="cpu", seed=seed, progress=False, tensorboard=False, out=d, holdout=holdout)
        if fields is None:
            cfg = apply_preset(base, "fast")
        elif fields.get("_on_fast"):
            cfg = apply_preset(base, "fast")
            for k, v in fields.items():
                if k != "_on_fast":
                    setattr(cfg, k, v)
        else:
            cfg = apply_preset(base, "fast")
            for k, v in {**OLD_FAST, "epochs": 1, "warmup_epochs": 0.0, **fields}.items():
                setattr(cfg, k, v)
        s = train(cfg, log=lambda _line: None)
    return {
        "variant": name,
        "seed": seed,
        "accuracy": s["test_accuracy"],
        "images_per_s": s["images_per_s_median"],
        "train_seconds": s["train_seconds"],
        "epochs": cfg.epochs,
        "batch_size": cfg.batch_size,
    }


def table(rows: list[dict], variants: list[str], scored_on: str) -> str:
    md = [
        f"| variant | what changes | seeds | {scored_on} accuracy after the run, per seed | mean | min |",
        "| --- | --- | --- | --- | ---: | ---: |",
    ]
    for v in variants:
        rs = sorted((r for r in rows if r["variant"] == v), key=lambda r: r["seed"])
        accs = [r["accuracy"] for r in rs]
        md.append(
            f"| {v} | {VARIANTS[v][0]} | {','.join(str(r['seed']) for r in rs)} | {' / '.join(f'{a:.2f}' for a in accs)} | "
            f"{statistics.mean(accs):.2f} | {min(accs):.2f} |"
        )
    # The runs' wall-clock images/s stay in the json and log; on a shared machine they say more about the
    # neighbours than about the recipe. A step's cost is measured apart, by CPU time, in lenet_cpu_step.py.
    return (
        "Measured on a loaded, shared box: the accuracies do not depend on the load; no timing is read from "
        "these runs.\n\n" + "\n".join(md) + "\n\n" + STEP_COST
    )


STEP_COST = (
    "Step cost per image (what a lever costs in time): `python benchmarks/lenet_cpu_step.py --clock cpu "
    "--roofline ...` (benchmarks/results/lenet_cpu_step_fast.md), one thread, process CPU time: batch 128 costs "
    "1.19× batch 256 per image, batch 512 0.91×; label smoothing, the schedule and EMA cost nothing measurable; "
    "BatchNorm after conv1 ~2× (benchmarks/results/lenet_cpu_profile.md)."
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from: {', '.join(VARIANTS)}")
    ap.add_argument(
        "--holdout",
        type=int,
        default=10000,
        help="validation images held out of the training set (0: train on all, score the test set)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--merge", default=None, help="comma-separated result stems in --out to merge (no training)")
    ap.add_argument("--name", default="lenet_recipe_ablation", help="result file stem")
    add_output_args(ap)
    args = ap.parse_args()
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"--variants: unknown variant {v!r}; expected one of {', '.join(VARIANTS)}")
    if args.holdout < 0:
        ap.error(f"--holdout {args.holdout}: expected an integer >= 0")
    seeds = [int(s) for s in args.seeds.split(",")]
    check_output(args.out, args.name, force=args.force)
    if args.threads:
        torch.set_num_threads(args.threads)
    lines: list[str] = []

    def log(line):
        print(line, flush=True)
        lines.append(line)

    scored_on = f"validation (last {args.holdout} training images)" if args.holdout else "test"
    log(f"torch threads: {torch.get_num_threads()}; scored on: {scored_on}")
    rows = []
    for stem in args.merge.split(",") if args.merge else []:
        rows += read_json(Path(args.out) / f"{stem}.json")["rows"]
        lines += [f"--- {stem}.log ---", *(Path(args.out) / f"{stem}.log").read_text().splitlines()]
    if args.merge:
        variants = [v for v in variants if any(r["variant"] == v for r in rows)]
    for seed in seeds if not args.merge else []:
        for v in variants:
            r = run(v, seed, args.holdout or None)
            rows.append(r)
            log(
                f"[seed {seed}] {v:<14} {r['accuracy']:6.2f}%  {r['images_per_s']:>8,.0f} img/s  {r['train_seconds']:5.2f} s"
            )
    text = table(rows, variants, scored_on)
    print(text)
    save(args.name, rows, text, lines, torch.device("cpu"), out=args.out)


if __name__ == "__main__":
    main()
