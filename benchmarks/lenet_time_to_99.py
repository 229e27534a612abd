"""Time-to-99% test accuracy: trainlab's trainer vs the seed-style loop, in one run, same machine.

The seed-style loop is what the public solutions do: a per-sample Dataset + DataLoader, batch 64,
Adam lr 1e-3, num_workers 0, the same LeNet-5, evaluation after each epoch. Both clocks count
training time only (evaluation excluded, as in trainlab's summary). Target: ≥5× shorter on the
2-core CPU. On a GPU the same script reports trainlab's time-to-99% (target < 1 s) with warm-up /
compile time reported separately.

    python benchmarks/lenet_time_to_99.py [--device cpu] [--max-epochs 15] [--skip-seed-style]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import torch.nn.functional as F

from _common import add_output_args, check_output, save
from trainlab.lenet.config import TrainConfig
from trainlab.data.mnist import MNIST, load_mnist
from trainlab.device import resolve_device, synchronize
from trainlab.lenet.model import LeNet5
from trainlab.lenet.evaluate import evaluate
from trainlab.telemetry.rundir import RunDir
from trainlab.lenet.batches import build_test_batches
from trainlab.lenet.loop import train

TARGET = 99.0


def seed_style(device: torch.device, max_epochs: int, seed: int, log) -> dict:
    torch.manual_seed(seed)
    data = load_mnist()
    loader = torch.utils.data.DataLoader(MNIST(train=True, arrays=data), batch_size=64, shuffle=True, num_workers=0)
    test = build_test_batches(TrainConfig(), data, device)
    model = LeNet5().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_s, accs = 0.0, []
    for epoch in range(max_epochs):
        synchronize(device)
        t0 = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        synchronize(device)
        train_s += time.perf_counter() - t0
        acc = evaluate(model, test, device)["test_accuracy"]
        accs.append(acc)
        log(f"seed-style  epoch {epoch + 1:>2}  test_acc {acc:.2f}%  train {train_s:7.1f} s")
        if acc >= TARGET:
            return {"time_to_99_s": train_s, "epochs": epoch + 1, "final_accuracy": acc, "accuracies": accs}
    return {"time_to_99_s": None, "epochs": max_epochs, "final_accuracy": accs[-1], "accuracies": accs}


def trainlab_run(device: torch.device, seed: int, log, **overrides) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cfg = TrainConfig(device=str(device), seed=seed, progress=False, tensorboard=False, out=d, **overrides)
        s = train(cfg, log=lambda line: log(line) if line.startswith(("epoch", "done")) else None)
        accs = [r["test_accuracy"] for r in RunDir(d).read_metrics()]
    return {"time_to_99_s": s["time_to_99_seconds"], "epochs": s["epochs"], "final_accuracy": s["test_accuracy"],
            "warmup_s": s["warmup_seconds"], "train_seconds": s["train_seconds"], "accuracies": accs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-epochs", type=int, default=15, help="seed-style loop gives up after this many epochs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-seed-style", action="store_true", help="GPU runs: only trainlab's time-to-99")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--batch-size", type=int, default=None)
    add_output_args(ap)
    args = ap.parse_args()
    device = resolve_device(args.device)
    check_output(args.out, f"lenet_time_to_99_{device.type}", force=args.force)
    lines: list[str] = []

    def log(line):
        print(line, flush=True)
        lines.append(line)

    overrides = {k: v for k, v in {"compile": args.compile, "batch_size": args.batch_size}.items() if v}
    ours = trainlab_run(device, args.seed, log, **overrides)
    rows = [{"loop": "trainlab defaults (device loader, OneCycle AdamW 5e-3, batch 256)", **ours}]
    if not args.skip_seed_style:
        rows.append({"loop": "seed-style (Dataset+DataLoader, batch 64, Adam 1e-3)", **seed_style(device, args.max_epochs, args.seed, log)})
    md = ["| loop | time to 99% (s) | epochs | final acc (%) |", "| --- | ---: | ---: | ---: |"]
    for r in rows:
        t = f"{r['time_to_99_s']:.1f}" if r["time_to_99_s"] is not None else f"not reached in {r['epochs']} epochs"
        md.append(f"| {r['loop']} | {t} | {r['epochs']} | {r['final_accuracy']:.2f} |")
    if len(rows) == 2 and rows[0]["time_to_99_s"] and rows[1]["time_to_99_s"]:
        ratio = rows[1]["time_to_99_s"] / rows[0]["time_to_99_s"]
        md.append(f"\nSpeed-up in time-to-99%: **{ratio:.1f}×** (target ≥5×).")
        rows.append({"loop": "ratio", "speedup": ratio})
    if device.type == "cuda":
        md.append(f"\nWarm-up/compile (excluded): {ours['warmup_s']:.2f} s.")
    text = "\n".join(md)
    print(text)
    save(f"lenet_time_to_99_{device.type}", rows, text, lines, device, out=args.out)


if __name__ == "__main__":
    main()
