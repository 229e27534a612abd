"""LeNet-5 training step: eager vs torch.compile vs CUDA graphs, and how unsynchronized timing misleads.

    python benchmarks/dp_compile.py --device cpu --steps 50 [--batch-size 128] [--threads 2]
    python benchmarks/dp_compile.py --device cuda --steps 200          # adds the GPU-only rows

Every row times trainlab's own training step (trainlab.lenet.step, fused AdamW, fp32, NCHW) in one
of its modes (median and p10–p90 over individually synchronized steps; compile/capture time reported apart):
- eager                  the plain step (forward, backward, AdamW), `--step-mode eager`
- compile                torch.compile(model) (inductor), `--step-mode compile` (= `trainlab train --compile`)
- compile-reduce-overhead   [CUDA only] the compile step with torch.compile(mode="reduce-overhead"): inductor + CUDA graphs
- cudagraph              [CUDA only] `--step-mode cudagraph`: the whole step (forward, backward, capturable
                         fused AdamW, lr on the device) captured once and replayed: one launch instead of ~100 kernels
Then the asynchronous-execution demo: N steps timed without a synchronize (what the host *queued*)
and with one (what the device *finished*). On a CPU both are the same — the CPU runs each op before
returning — so the demo only means something on CUDA, where the first number can be many times
too small. LeNet-5 is tiny, so on a GPU its step is launch-bound: exactly where graphs help.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

import torch
from _common import add_output_args, check_output, save

from trainlab.data.loader import DeviceLoader
from trainlab.data.mnist import load_mnist
from trainlab.device import resolve_device, synchronize
from trainlab.lenet.asynchrony import queued_finished
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.plan import STEP_MODES, resolve
from trainlab.lenet.setup import build_model, build_optimizer
from trainlab.lenet.step import make_step
from trainlab.stats import format_spread, summarize


def build(variant, device, x0, y0):
    """(trainlab's training step in the variant's mode, setup seconds): compile/capture is paid here,
    outside the timed steps. compile-reduce-overhead is the compile mode with torch.compile's
    mode="reduce-overhead" (a plan field, not a trainlab flag)."""
    mode = "compile" if variant == "compile-reduce-overhead" else variant
    if mode not in STEP_MODES:
        raise SystemExit(f"unknown variant {variant}")
    cfg = TrainConfig(device=str(device), lr=3e-3, schedule="constant", amp="off", channels_last="off", step_mode=mode)
    plan = resolve(cfg, device)
    if variant == "compile-reduce-overhead":
        plan = replace(plan, compile_mode="reduce-overhead")
    model = build_model(plan)
    step = make_step(plan, model, build_optimizer(plan, model))
    synchronize(device)
    t0 = time.perf_counter()
    step.prepare(x0, y0)  # the capture (cudagraph), or one forward/backward that compiles
    # The first steps of a compiled step compile the rest (inductor traces forward and backward;
    # reduce-overhead records its graphs).
    for _ in range(3):
        step(x0, y0)
    synchronize(device)
    return step, time.perf_counter() - t0


def time_steps(step, batches, device):
    times = []
    for x, y in batches:
        synchronize(device)
        t0 = time.perf_counter()
        step(x, y)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument(
        "--variants", default=None, help="default: eager,compile (+ compile-reduce-overhead,cudagraph on CUDA)"
    )
    add_output_args(ap)
    args = ap.parse_args()
    check_output(args.out, "dp_compile", force=args.force)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    on_cuda = device.type == "cuda"
    variants = (
        args.variants.split(",")
        if args.variants
        else (["eager", "compile", "compile-reduce-overhead", "cudagraph"] if on_cuda else ["eager", "compile"])
    )
    data = load_mnist(None)
    loader = DeviceLoader(
        data.train_images[: args.batch_size * args.steps],
        data.train_labels[: args.batch_size * args.steps],
        args.batch_size,
        device,
        shuffle=False,
    )
    batches = list(loader)
    x0, y0 = batches[0]

    rows, lines = (
        [],
        [
            f"device {device}, batch {args.batch_size}, {args.steps} timed steps, torch threads {torch.get_num_threads()}"
        ],
    )
    for variant in variants:
        if variant in ("cudagraph", "compile-reduce-overhead") and not on_cuda:
            lines.append(f"{variant}: skipped (CUDA only)")
            continue
        step, setup_s = build(variant, device, x0, y0)
        times = time_steps(step, batches, device)
        queued, finished = queued_finished(step, batches, device)  # the demo `trainlab async` runs too
        s = summarize([t * 1e3 for t in times])
        row = {
            "variant": variant,
            "device": str(device),
            "batch_size": args.batch_size,
            "steps": len(times),
            # throughput of steps run back to back, as training runs them: the synced column's rate (a
            # step synchronized on its own also pays the launch latency the next step would hide)
            "step_ms": s,
            "setup_seconds": setup_s,
            "images_per_s": args.batch_size / finished,
            "unsynced_ms_per_step": queued * 1e3,
            "synced_ms_per_step": finished * 1e3,
        }
        rows.append(row)
        line = (
            f"{variant:<24} step {format_spread(s, unit=' ms')}  setup (compile/capture + 3 steps) {setup_s:.1f} s  "
            f"async demo: queued {queued * 1e3:.2f} ms/step vs finished {finished * 1e3:.2f} ms/step"
        )
        print(line, flush=True)
        lines.append(line)
    eager = next((r for r in rows if r["variant"] == "eager"), None)
    md = [
        "| variant | step ms, median [p10–p90] | speed-up vs eager | images/s (back to back: batch / synced ms) | compile/capture s | "
        "unsynced ms/step (queued) | synced ms/step (finished) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        speedup = eager["step_ms"]["median"] / r["step_ms"]["median"] if eager else float("nan")
        md.append(
            f"| {r['variant']} | {format_spread(r['step_ms'])} | {speedup:.2f}× | {r['images_per_s']:,.0f} | "
            f"{r['setup_seconds']:.1f} | {r['unsynced_ms_per_step']:.2f} | {r['synced_ms_per_step']:.2f} |"
        )
    if not on_cuda:
        md.append(
            "\nCUDA graphs (whole-step capture, and torch.compile mode=reduce-overhead) are CUDA-only: written in "
            "this script, skipped here. On a CPU 'queued' equals 'finished' — every op has run when it returns — so "
            "the asynchronous-timing demo only shows its point on a GPU (run with --device cuda)."
        )
    load = os.getloadavg()
    md.append(
        f"\nLoad average at the end: {load[0]:.1f} on {os.cpu_count()} cores (a shared machine: timings are noisy; "
        "compare rows of one run, not runs)."
    )
    save("dp_compile", rows, "\n".join(md), lines, device=device, out=args.out, kind="dp_compile")


if __name__ == "__main__":
    main()
