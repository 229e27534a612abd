"""Cost of one LeNet-5 training step on the CPU under each execution setting, measured interleaved.

Every variant (memory format, bf16 autocast, BatchNorm, torch.compile, optimizer implementation,
threads, batch size) gets its own model, optimizer and batch; then the variants take turns, one step
each, for many rounds (trainlab.stats.time_interleaved, the timer every trainlab benchmark uses). A busy neighbour on a shared machine therefore slows all of them alike,
and the ratio to the first variant is the figure to trust. Compile time is reported separately.

A variant is a '+'-joined list of settings, e.g. `bn+bf16+cl+compile@1`:
    cl        channels-last memory format          bf16     torch.autocast(cpu, bfloat16)
    bn        LeNet-5 with BatchNorm (best)         compile  torch.compile the model (inductor, C++ on CPU)
    bn234     BatchNorm after conv2, fc1, fc2 only (--no-batchnorm-conv1; the fast preset)
    fused     AdamW(fused=True)                     foreach  AdamW(foreach=True) (the default is chosen by torch)
    muon      --optimizer muon (Muon for the hidden weight matrices, AdamW for the rest; lenet.muon)
    avg       average pooling (--pool avg; the fast preset since issue 40, round 7)
    actpool   the classic order ReLU → max-pool (LeNet5 pools first since issue 23: the same numbers, cheaper)
    fused1    conv1 → ReLU → max-pool as our one fused C++ operator (--ops fused; trainlab.ops.conv_relu_pool),
              and conv2 computed in NCHW (lenet.model.NCHWConv2d)
    cl2       with fused1: conv2 back in the model's layout (a plain nn.Conv2d), to measure what NCHW buys
    bsN       batch size N (default --batch-size)   @T       T threads (default: torch's default)

    python benchmarks/lenet_cpu_step.py --variants fp32,cl,bf16,bf16+cl,bn+bf16+cl [--rounds 20] [--steps 5] [--out DIR] [--name NAME] [--force]

`--roofline` adds a roofline table: the matmul FLOPs of one training image (convolutions and linear
layers, forward and backward, counted from the layer shapes), the rate each variant achieves, and
that rate as a fraction of the CPU's bf16 and fp32 matmul peak, measured by a square matmul at each
thread count taking its turns in the same rounds. `--clock cpu` times by process CPU time instead of
wall time: on a shared machine that leaves out the time spent waiting for a core (1-thread variants only).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from _common import add_output_args, check_output, save

from trainlab.lenet.config import TrainConfig
from trainlab.lenet.model import LeNet5
from trainlab.lenet.muon import MuonAdamW, muon_groups
from trainlab.lenet.plan import resolve
from trainlab.lenet.step import make_step
from trainlab.stats import time_interleaved

SETTINGS = {
    "fp32",
    "cl",
    "bf16",
    "bn",
    "bn234",
    "compile",
    "fused",
    "foreach",
    "actpool",
    "fused1",
    "cl2",
    "muon",
    "avg",
}


def parse_variant(spec: str, batch_size: int) -> dict:
    body, _, threads = spec.partition("@")
    v = {"spec": spec, "threads": int(threads) if threads else None, "batch_size": batch_size}
    for part in body.split("+"):
        if part.startswith("bs") and part[2:].isdigit():
            v["batch_size"] = int(part[2:])
        elif part in SETTINGS:
            v[part] = True
        else:
            raise SystemExit(
                f"--variants: unknown setting {part!r} in {spec!r}; expected {', '.join(sorted(SETTINGS))}, bsN, @T"
            )
    return v


def build_model(v: dict) -> torch.nn.Module:
    """The variant's LeNet-5, from seed 0: every variant starts from the same weights."""
    torch.manual_seed(0)
    model = LeNet5(
        batchnorm=bool(v.get("bn") or v.get("bn234")),
        batchnorm_conv1=not v.get("bn234"),
        ops="fused" if v.get("fused1") else "aten",
        pool="avg" if v.get("avg") else "max",
    )
    if v.get("actpool"):  # swap each (max-pool, ReLU) pair back
        f = list(model.features)
        f[2:4], f[6:8] = f[3:1:-1], f[7:5:-1]
        model.features = torch.nn.Sequential(*f)
    if v.get("cl2"):  # same weights, ATen's layout choice
        plain = torch.nn.Conv2d(6, 16, 5, bias=model.features[4].bias is not None)
        plain.load_state_dict(model.features[4].state_dict())
        model.features[4] = plain
    return model


def plan_of(v: dict):
    """The variant's settings as trainlab resolves them (precision, memory format, step mode); the
    layer surgeries (actpool, cl2) and the optimizer implementation stay the variant's own."""
    cfg = TrainConfig(
        device="cpu",
        batch_size=v["batch_size"],
        lr=1e-3,
        amp="bf16" if v.get("bf16") else "off",
        channels_last="on" if v.get("cl") else "off",
        step_mode="compile" if v.get("compile") else "eager",
    )
    plan = resolve(cfg, torch.device("cpu"))
    # `bf16` is bf16 autocast here even on a CPU without bf16 units, where trainlab's plan trains in fp32:
    # the benchmark measures what that choice avoids
    return dataclasses.replace(plan, precision="bf16") if v.get("bf16") else plan


class Variant:
    """One variant's model, optimizer and batch, stepped by trainlab's own training step (lenet.step)."""

    def __init__(self, v: dict):
        self.v = v
        plan = plan_of(v)
        self.model = build_model(v)
        self.x = torch.randn(v["batch_size"], 1, 28, 28)
        self.y = torch.randint(0, 10, (v["batch_size"],))
        if plan.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
            self.x = self.x.contiguous(memory_format=torch.channels_last)  # as trainlab's loader does
        kw = {"fused": True} if v.get("fused") else {"foreach": True} if v.get("foreach") else {}
        self.optimizer = (
            MuonAdamW(muon_groups(self.model), lr=plan.lr, weight_decay=plan.weight_decay)
            if v.get("muon")
            else torch.optim.AdamW(self.model.parameters(), lr=plan.lr, **kw)
        )
        self.training_step = make_step(plan, self.model, self.optimizer)
        t0 = time.perf_counter()
        for _ in range(3):  # compilation, oneDNN primitive creation, allocator warm-up
            self.step()
        self.warmup_s = time.perf_counter() - t0

    def step(self) -> None:
        with _threads(self.v["threads"]):
            self.training_step(self.x, self.y)


def training_flops_per_image(model: torch.nn.Module) -> int:
    """Matmul FLOPs (2 per multiply-add) of one image's forward and backward pass through the convolutions
    and linear layers. Backward costs twice the forward (input and weight gradients) except for the first
    layer, whose input needs no gradient. BatchNorm, ReLU, pooling and the loss are not matmuls: left out."""
    macs: list[int] = []

    def hook(module, _inputs, out):
        per_output = module.weight[0].numel()  # in_channels/groups × kernel area, or in_features
        macs.append(out[0].numel() * per_output)

    if getattr(model, "fused", False):  # the fused stage's output is pooled: count the same network unfused
        model = LeNet5(batchnorm=isinstance(model.features[5], torch.nn.BatchNorm2d), batchnorm_conv1=False)
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, 1, 28, 28))
    finally:
        for h in handles:
            h.remove()
        model.train()
    return 2 * (3 * sum(macs) - macs[0])


class MatmulPeak:
    """A square bf16 or fp32 matmul, timed in turns with the variants: the CPU's attainable matmul rate."""

    def __init__(self, dtype: torch.dtype, threads: int | None, n: int = 1024):
        self.n, self.threads = n, threads
        self.spec = f"matmul-{str(dtype).removeprefix('torch.')}" + (f"@{threads}" if threads else "")
        self.a, self.b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        self.step()

    def step(self) -> None:
        with _threads(self.threads):
            self.a @ self.b


def roofline(variants: list, stats: dict, peaks: dict) -> tuple[str, list[dict]]:
    rows, md = (
        [],
        [
            "| variant | threads | matmul MFLOP per training image | ms/step median | achieved GFLOP/s | "
            "bf16 matmul peak GFLOP/s (share) | fp32 matmul peak GFLOP/s (share) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ],
    )
    for var in variants:
        threads = var.v["threads"] or torch.get_num_threads()
        flops = training_flops_per_image(var.model)
        ms = stats[var.v["spec"]]["median"] * 1e3
        achieved = flops * var.v["batch_size"] / ms / 1e6
        bf16, fp32 = (
            2 * peaks[(dtype, threads)].n ** 3 / stats[peaks[(dtype, threads)].spec]["median"] / 1e9
            for dtype in (torch.bfloat16, torch.float32)
        )
        rows.append(
            {
                "variant": var.v["spec"],
                "threads": threads,
                "flops_per_image": flops,
                "median_ms": ms,
                "achieved_gflops": achieved,
                "bf16_peak_gflops": bf16,
                "fp32_peak_gflops": fp32,
                "share_of_bf16_peak": achieved / bf16,
                "share_of_fp32_peak": achieved / fp32,
            }
        )
        md.append(
            f"| {var.v['spec']} | {threads} | {flops / 1e6:.2f} | {ms:.2f} | {achieved:.1f} | "
            f"{bf16:.0f} ({100 * achieved / bf16:.0f} %) | {fp32:.0f} ({100 * achieved / fp32:.0f} %) |"
        )
    return "\n".join(md), rows


class _threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        if self.n:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="fp32,cl,bf16,bf16+cl,bn,bn+bf16,bn+bf16+cl,bn234+bf16+cl,bs64")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20, help="progress lines")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per variant between progress lines")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: elapsed time; cpu: process CPU time (a loaded shared box; 1-thread variants only)",
    )
    ap.add_argument(
        "--roofline", action="store_true", help="also time bf16/fp32 matmul peaks and report the roofline table"
    )
    ap.add_argument("--name", default="lenet_cpu_step", help="result file stem: <out>/<name>.{json,md,log}")
    add_output_args(ap)
    args = ap.parse_args()
    check_output(args.out, args.name, force=args.force)
    specs = [parse_variant(s, args.batch_size) for s in args.variants.split(",")]
    if args.clock == "cpu" and any(v["threads"] != 1 for v in specs):
        ap.error("--clock cpu: every variant needs @1 (the CPU time of several threads is not a step's time)")
    lines = [f"torch threads by default: {torch.get_num_threads()}; clock: {args.clock}"]
    print(lines[0])
    variants = []
    for v in specs:
        variants.append(Variant(v))
        line = f"built {v['spec']:<28} warm-up {variants[-1].warmup_s:6.2f} s"
        print(line, flush=True)
        lines.append(line)

    def progress(runs: int) -> None:
        if runs % args.steps == 0:
            line = f"round {runs // args.steps:>3}/{args.rounds}: {runs} steps of each variant"
            print(line, flush=True)
            lines.append(line)

    # one bf16 and one fp32 matmul per thread count in use, taking turns with the variants
    peaks = (
        {
            (dtype, v["threads"] or torch.get_num_threads()): MatmulPeak(dtype, v["threads"])
            for v in specs
            for dtype in (torch.bfloat16, torch.float32)
        }
        if args.roofline
        else {}
    )
    stats = time_interleaved(
        {**{var.v["spec"]: var.step for var in variants}, **{p.spec: p.step for p in peaks.values()}},
        warmup=0,
        rounds=args.rounds * args.steps,
        on_round=progress,
        clock=time.process_time if args.clock == "cpu" else time.perf_counter,
    )
    rows = []
    base = None
    for var in variants:
        st = stats[var.v["spec"]]
        med = st["median"] * 1e3
        base = base or med
        rows.append(
            {
                "variant": var.v["spec"],
                "batch_size": var.v["batch_size"],
                "threads": var.v["threads"] or torch.get_num_threads(),
                "median_ms": med,
                "p10_ms": st["p10"] * 1e3,
                "p90_ms": st["p90"] * 1e3,
                "images_per_s": var.v["batch_size"] / med * 1e3,
                "speedup": base / med * var.v["batch_size"] / specs[0]["batch_size"],
                "warmup_s": var.warmup_s,
            }
        )
    md = [
        "| variant | batch | threads | ms/step median [p10, p90] | images/s | × first (images/s) | warm-up/compile (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    md += [
        f"| {r['variant']} | {r['batch_size']} | {r['threads']} | {r['median_ms']:.2f} [{r['p10_ms']:.2f}, {r['p90_ms']:.2f}] | "
        f"{r['images_per_s']:,.0f} | {r['speedup']:.2f} | {r['warmup_s']:.1f} |"
        for r in rows
    ]
    text = "\n".join(md)
    result = rows
    if peaks:
        roof_md, roof_rows = roofline(variants, stats, peaks)
        text += (
            "\n\nRoofline (matmul FLOPs only; the peaks are square 1024³ matmuls timed in the same rounds):\n\n"
            + roof_md
        )
        result = {"steps": rows, "roofline": roof_rows}
    print(text)
    save(args.name, result, text, lines, out=args.out)


if __name__ == "__main__":
    main()
