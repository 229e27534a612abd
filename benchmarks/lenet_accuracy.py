"""Test accuracy of the default and `best` presets over several seeds (mean ± spread).

    python benchmarks/lenet_accuracy.py --preset default --seeds 0,1,2 [--device cpu]
Targets: default ≥99.0%, best ≥99.5% (mean over ≥3 seeds).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from _common import save
from trainlab.config import TrainConfig, apply_preset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="default")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--act", default="relu")
    ap.add_argument("--epochs", type=int, default=None)
    args = ap.parse_args()
    from trainlab.train.loop import train

    rows, lines = [], []
    for seed in [int(s) for s in args.seeds.split(",")]:
        explicit = {"epochs": args.epochs} if args.epochs else {}
        cfg = apply_preset(TrainConfig(device=args.device, seed=seed, act=args.act, progress=False, tensorboard=False, **explicit),
                           args.preset, explicit=set(explicit))
        with tempfile.TemporaryDirectory() as d:
            cfg.out = d
            s = train(cfg, log=lambda line: (print(line, flush=True), lines.append(line)) if line.startswith(("epoch", "done")) else None)
        rows.append({"preset": args.preset, "act": args.act, "seed": seed, "epochs": cfg.epochs, "test_accuracy": s["test_accuracy"],
                     "train_seconds": s["train_seconds"], "time_to_99_s": s["time_to_99_seconds"], "device": s["device"]})
    accs = [r["test_accuracy"] for r in rows]
    mean = statistics.mean(accs)
    sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
    md = ["| preset | act | seed | epochs | test acc (%) | train s |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    md += [f"| {r['preset']} | {r['act']} | {r['seed']} | {r['epochs']} | {r['test_accuracy']:.2f} | {r['train_seconds']:.0f} |" for r in rows]
    md.append(f"\n**{args.preset} / {args.act}: {mean:.2f} ± {sd:.2f} % (mean ± sd over {len(accs)} seeds; min {min(accs):.2f}, max {max(accs):.2f})**")
    text = "\n".join(md)
    print(text)
    save(f"lenet_accuracy_{args.preset}_{args.act}", {"rows": rows, "mean": mean, "sd": sd, "min": min(accs), "max": max(accs)}, text, lines)


if __name__ == "__main__":
    main()
