"""Where a LeNet-5 training step goes on the CPU: torch.profiler, per layer, forward and backward.

Each layer's forward runs inside a `record_function("layer/<name>")` range (module hooks); its
backward is the autograd node whose sequence number the profiler links to an op of that range. The
rest of the step is the loss, `zero_grad`, the optimizer step and what no op accounts for (Python and
dispatcher overhead: step wall time minus the ops' time). One table per variant (memory format,
precision, BatchNorm, batch size, threads), all measured in one process so the ratios are comparable.

    python benchmarks/lenet_cpu_profile.py [--threads 1,2] [--batch-size 256] [--steps 30] [--out DIR] [--name NAME] [--force]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from _common import add_output_args, check_output, save
from trainlab.lenet.model import LeNet5

BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
# (label, channels_last, bf16 autocast, batchnorm: "" | "all" | "234" = after conv2, fc1, fc2 only)
VARIANTS = [
    ("fp32 NCHW (defaults)", False, False, ""),
    ("fp32 channels-last", True, False, ""),
    ("bf16 autocast NCHW", False, True, ""),
    ("bf16 autocast channels-last", True, True, ""),
    ("bf16 NCHW + BatchNorm (all)", False, True, "all"),
    ("bf16 channels-last + BatchNorm (all)", True, True, "all"),
    ("bf16 channels-last + BatchNorm 2-4 (fast preset)", True, True, "234"),
]


def layer_names(model: LeNet5) -> dict[torch.nn.Module, str]:
    """conv1, bn1, relu1, pool1, …, fc3: the names a student would use, from the Sequential order."""
    names, counters = {}, defaultdict(int)
    kinds = {torch.nn.Conv2d: "conv", torch.nn.BatchNorm2d: "bn", torch.nn.BatchNorm1d: "bn", torch.nn.ReLU: "relu",
             torch.nn.MaxPool2d: "pool", torch.nn.AvgPool2d: "pool", torch.nn.Linear: "fc"}
    for module in [*model.features, *model.classifier]:
        kind = kinds.get(type(module))
        if kind is None:
            continue  # Identity (no BatchNorm), Flatten (a view)
        if kind == "bn":  # numbered by the layer it normalizes (bn2 follows conv2 even without bn1)
            names[module] = f"bn{counters['conv'] + counters['fc']}"
            continue
        counters[kind] += 1
        names[module] = f"{kind}{counters[kind]}"
    return names


def instrument(model: LeNet5) -> list:
    """Open a record_function range around every named layer's forward."""
    handles = []
    for module, name in layer_names(model).items():
        def pre(mod, args, name=name):
            mod._profile_range = record_function(f"layer/{name}")
            mod._profile_range.__enter__()

        def post(mod, args, out):
            mod._profile_range.__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


def make_step(model, optimizer, x, y, bf16: bool):
    def step():
        with record_function("part/forward"):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
        with record_function("part/zero_grad"):
            optimizer.zero_grad(set_to_none=True)
        with record_function("part/backward"):
            loss.backward()
        with record_function("part/optimizer"):
            optimizer.step()
    return step


def _descendants(event):
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def attribute(events, steps: int) -> dict[str, float]:
    """Milliseconds per step for each layer's forward and backward and each other part of the step."""
    top = [e for e in events if e.cpu_parent is None]
    ms: dict[str, float] = defaultdict(float)
    seq_to_layer: dict[int, str] = {}
    for e in events:
        if e.name.startswith("layer/"):
            layer = e.name[len("layer/"):]
            ms[f"{layer} forward"] += e.cpu_time_total / 1e3 / steps
            for d in _descendants(e):
                if d.sequence_nr >= 0:
                    seq_to_layer[d.sequence_nr] = layer
    parts = {e.name: 0.0 for e in top}
    for e in top:
        parts[e.name] = parts.get(e.name, 0.0) + e.cpu_time_total / 1e3 / steps
    layers_fwd = sum(v for k, v in ms.items() if k.endswith("forward"))
    ms["loss + flatten (forward)"] = parts.get("part/forward", 0.0) - layers_fwd
    backward_nodes = 0.0
    for e in events:
        if e.name.startswith(BACKWARD_PREFIX):
            layer = seq_to_layer.get(e.sequence_nr)
            key = f"{layer} backward" if layer else "loss + flatten (backward)"
            ms[key] += e.cpu_time_total / 1e3 / steps
            backward_nodes += e.cpu_time_total / 1e3 / steps
    ms["autograd engine (backward, outside nodes)"] = parts.get("part/backward", 0.0) - backward_nodes
    ms["zero_grad"] = parts.get("part/zero_grad", 0.0)
    ms["optimizer step"] = parts.get("part/optimizer", 0.0)
    return dict(ms)


def profile_variant(label: str, channels_last: bool, bf16: bool, batchnorm: str, batch_size: int, steps: int,
                    threads: int) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = LeNet5(batchnorm=bool(batchnorm), batchnorm_conv1=batchnorm == "all")
    x = torch.randn(batch_size, 1, 28, 28)
    y = torch.randint(0, 10, (batch_size,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = make_step(model, optimizer, x, y, bf16)
    for _ in range(10):  # warm-up: oneDNN primitive creation, allocator
        step()
    # Wall time per step without the profiler (its own overhead is not the step's).
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    wall_ms = statistics.median(walls) * 1e3
    handles = instrument(model)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    for h in handles:
        h.remove()
    ms = attribute(prof.events(), steps)
    profiled = sum(ms.values())
    return {"variant": label, "threads": threads, "batch_size": batch_size, "wall_ms": wall_ms,
            "images_per_s": batch_size / wall_ms * 1e3, "profiled_ms": profiled, "ms": ms}


def table(results: list[dict]) -> str:
    rows = sorted({k for r in results for k in r["ms"]}, key=_row_order)
    head = "| per step (ms) | " + " | ".join(f"{r['variant']}, {r['threads']} thr" for r in results) + " |"
    md = [head, "| --- |" + " ---: |" * len(results)]
    for k in rows:
        cells = []
        for r in results:
            v = r["ms"].get(k)
            cells.append("" if v is None else f"{v:.2f} ({100 * v / r['profiled_ms']:.0f} %)")
        md.append(f"| {k} | " + " | ".join(cells) + " |")
    md.append("| **sum of the above (profiled)** | " + " | ".join(f"**{r['profiled_ms']:.2f}**" for r in results) + " |")
    md.append("| wall time per step, no profiler (median) | " + " | ".join(f"{r['wall_ms']:.2f}" for r in results) + " |")
    md.append("| images/s (no profiler) | " + " | ".join(f"{r['images_per_s']:,.0f}" for r in results) + " |")
    return "\n".join(md)


def _row_order(key: str):
    order = ["conv1", "bn1", "relu1", "pool1", "conv2", "bn2", "relu2", "pool2", "fc1", "bn3", "relu3", "fc2", "bn4",
             "relu4", "fc3"]
    layer, _, phase = key.partition(" ")
    if layer in order:
        return (0 if phase == "forward" else 1, order.index(layer), key)
    return (2, 0, key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts, each profiled in this run")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30, help="profiled steps per variant (after 10 warm-up steps)")
    ap.add_argument("--name", default="lenet_cpu_profile", help="result file stem: <out>/<name>.{json,md,log}")
    add_output_args(ap)
    args = ap.parse_args()
    check_output(args.out, args.name, force=args.force)
    lines: list[str] = []
    results = []
    for threads in [int(t) for t in args.threads.split(",")]:
        for label, cl, bf16, bn in VARIANTS:
            r = profile_variant(label, cl, bf16, bn, args.batch_size, args.steps, threads)
            line = (f"{label:<46} threads {threads}  wall {r['wall_ms']:6.2f} ms/step  {r['images_per_s']:>8,.0f} img/s  "
                    f"profiled {r['profiled_ms']:6.2f} ms")
            print(line, flush=True)
            lines.append(line)
            results.append(r)
    text = "\n\n".join(table([r for r in results if r["threads"] == t]) for t in sorted({r["threads"] for r in results}))
    text = f"LeNet-5 training step on the CPU, batch {args.batch_size}, AdamW; ms per step (share of the profiled step).\n\n" + text
    print(text)
    save(args.name, results, text, lines + text.splitlines(), out=args.out)


if __name__ == "__main__":
    main()
