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
    bsN       batch size N (default --batch-size)   @T       T threads (default: torch's default)

    python benchmarks/lenet_cpu_step.py --variants fp32,cl,bf16,bf16+cl,bn+bf16+cl [--rounds 20] [--steps 5] [--out DIR] [--name NAME] [--force]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from _common import add_output_args, check_output, save
from trainlab.lenet.model import LeNet5
from trainlab.stats import time_interleaved

SETTINGS = {"fp32", "cl", "bf16", "bn", "bn234", "compile", "fused", "foreach"}


def parse_variant(spec: str, batch_size: int) -> dict:
    body, _, threads = spec.partition("@")
    v = {"spec": spec, "threads": int(threads) if threads else None, "batch_size": batch_size}
    for part in body.split("+"):
        if part.startswith("bs") and part[2:].isdigit():
            v["batch_size"] = int(part[2:])
        elif part in SETTINGS:
            v[part] = True
        else:
            raise SystemExit(f"--variants: unknown setting {part!r} in {spec!r}; expected {', '.join(sorted(SETTINGS))}, bsN, @T")
    return v


class Variant:
    def __init__(self, v: dict):
        self.v = v
        torch.manual_seed(0)
        self.model = LeNet5(batchnorm=bool(v.get("bn") or v.get("bn234")), batchnorm_conv1=not v.get("bn234"))
        self.x = torch.randn(v["batch_size"], 1, 28, 28)
        self.y = torch.randint(0, 10, (v["batch_size"],))
        if v.get("cl"):
            self.model = self.model.to(memory_format=torch.channels_last)
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        kw = {"fused": True} if v.get("fused") else {"foreach": True} if v.get("foreach") else {}
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3, **kw)
        self.forward = torch.compile(self.model) if v.get("compile") else self.model
        t0 = time.perf_counter()
        for _ in range(3):  # compilation, oneDNN primitive creation, allocator warm-up
            self.step()
        self.warmup_s = time.perf_counter() - t0

    def step(self) -> None:
        with _threads(self.v["threads"]):
            self._step()

    def _step(self) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(self.v.get("bf16"))):
            logits = self.forward(self.x)
        loss = F.cross_entropy(logits.float(), self.y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


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
    ap.add_argument("--name", default="lenet_cpu_step", help="result file stem: <out>/<name>.{json,md,log}")
    add_output_args(ap)
    args = ap.parse_args()
    check_output(args.out, args.name, force=args.force)
    specs = [parse_variant(s, args.batch_size) for s in args.variants.split(",")]
    lines = [f"torch threads by default: {torch.get_num_threads()}"]
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

    stats = time_interleaved({var.v["spec"]: var.step for var in variants}, warmup=0, rounds=args.rounds * args.steps,
                             on_round=progress)
    rows = []
    base = None
    for var in variants:
        st = stats[var.v["spec"]]
        med = st["median"] * 1e3
        base = base or med
        rows.append({"variant": var.v["spec"], "batch_size": var.v["batch_size"], "threads": var.v["threads"] or torch.get_num_threads(),
                     "median_ms": med, "p10_ms": st["p10"] * 1e3, "p90_ms": st["p90"] * 1e3,
                     "images_per_s": var.v["batch_size"] / med * 1e3, "speedup": base / med * var.v["batch_size"] / specs[0]["batch_size"],
                     "warmup_s": var.warmup_s})
    md = ["| variant | batch | threads | ms/step median [p10, p90] | images/s | × first (images/s) | warm-up/compile (s) |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    md += [f"| {r['variant']} | {r['batch_size']} | {r['threads']} | {r['median_ms']:.2f} [{r['p10_ms']:.2f}, {r['p90_ms']:.2f}] | "
           f"{r['images_per_s']:,.0f} | {r['speedup']:.2f} | {r['warmup_s']:.1f} |" for r in rows]
    text = "\n".join(md)
    print(text)
    save(args.name, rows, text, lines, out=args.out)


if __name__ == "__main__":
    main()
