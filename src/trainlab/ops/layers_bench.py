"""`trainlab ops bench`: each LeNet-5 layer's forward and backward time, per implementation, vs ATen.

For every layer of LeNet-5 (conv1 … fc3 and the activations between them, at its real shape), every
batch size and every implementation, the harness times the forward pass and, separately, the
backward pass (a forward is run untimed first; the backward computes the gradients training needs:
conv1's input is data and gets none). Runs are interleaved — run 1 of every implementation, then
run 2, … — so a change in machine load hits all of them alike, and the table reports the median,
the p10–p90 spread and the ratio of medians to ATen. Warm-up runs are excluded.

The `python` rung is timed like the others: its ratio is the lesson. Triton on a CPU only runs
under the interpreter, whose speed means nothing, so `triton` (and `cuda`, and the CUDA-only naive
pool backward `cuda-atomic`) are timed only on a GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from trainlab.device import synchronize
from trainlab.errors import ConfigError, UserError
from trainlab.ops.conv import conv2d
from trainlab.ops.layer_args import IMPLS
from trainlab.ops.linear import linear
from trainlab.ops.pool import max_pool2d
from trainlab.ops.relu import relu
from trainlab.stats import summarize
from trainlab.telemetry.env import collect_env, format_header
from trainlab.telemetry.results import write_results

DEFAULT_BATCHES = (256, 4096)


@dataclass(frozen=True)
class Layer:
    """A LeNet-5 layer at batch `b`: `inputs(b, gen)` makes its tensors, `run(t, impl)` its forward."""

    name: str
    op: str
    inputs: Callable
    run: Callable
    input_needs_grad: bool = True


def _conv(name, c, h, oc, pad, first=False):
    def inputs(b, gen):
        return {"x": torch.randn(b, c, h, h, generator=gen), "weight": torch.randn(oc, c, 5, 5, generator=gen) * 0.2,
                "bias": torch.randn(oc, generator=gen)}
    return Layer(name, "conv2d", inputs, lambda t, impl: conv2d(t["x"], t["weight"], t["bias"], pad, impl=impl),
                 input_needs_grad=not first)


def _pool(name, c, h):
    return Layer(name, "max_pool2d", lambda b, gen: {"x": torch.randn(b, c, h, h, generator=gen)},
                 lambda t, impl: max_pool2d(t["x"], 2, impl=impl))


def _relu(name, *shape):
    return Layer(name, "relu", lambda b, gen: {"x": torch.randn(b, *shape, generator=gen)},
                 lambda t, impl: relu(t["x"], impl=impl))


def _fc(name, fin, fout):
    def inputs(b, gen):
        return {"x": torch.randn(b, fin, generator=gen), "weight": torch.randn(fout, fin, generator=gen) * 0.05,
                "bias": torch.randn(fout, generator=gen)}
    return Layer(name, "linear", inputs, lambda t, impl: linear(t["x"], t["weight"], t["bias"], impl=impl))


LAYERS = (
    _conv("conv1", 1, 28, 6, 2, first=True), _relu("relu1", 6, 28, 28), _pool("pool1", 6, 28),
    _conv("conv2", 6, 14, 16, 0), _relu("relu2", 16, 10, 10), _pool("pool2", 16, 10),
    _fc("fc1", 400, 120), _relu("relu3", 120), _fc("fc2", 120, 84), _relu("relu4", 84), _fc("fc3", 84, 10),
)
LAYER_NAMES = tuple(layer.name for layer in LAYERS)


def available_impls(device: torch.device) -> tuple[list[str], dict]:
    """Implementations to time on `device`, and {impl: why not} for the others."""
    if device.type == "cuda":   # on CUDA tensors `cpp` is the same extension op as `cuda`
        return ["aten", "python", "cuda", "triton", "cuda-atomic"], {"cpp": "on a GPU it runs the `cuda` kernels"}
    return ["aten", "python", "cpp"], {"triton": "CPU: Triton only runs interpreted here; interpreter speed is meaningless",
                                       "cuda": "no CUDA GPU"}


class _AtomicPool(torch.autograd.Function):
    """LeNet's 2x2 pool with the CUDA-only naive backward (one thread per output, atomicAdd into a
    zeroed dx): the "before" of the gather kernel, timed next to it on a GPU."""

    @staticmethod
    def forward(ctx, x):
        out, idx = torch.ops.trainlab.max_pool2d_fwd(x, [2, 2], [2, 2], [0, 0])
        ctx.save_for_backward(idx)
        ctx.hw = list(x.shape[2:])
        return out

    @staticmethod
    def backward(ctx, grad):
        (idx,) = ctx.saved_tensors
        return torch.ops.trainlab.max_pool2d_bwd_atomic(grad, idx, ctx.hw, [2, 2], [2, 2], [0, 0])


def _call(layer: Layer, tensors: dict, impl: str):
    if impl == "cuda-atomic":
        return _AtomicPool.apply(tensors["x"]) if layer.op == "max_pool2d" else None
    return layer.run(tensors, impl)


def _time_layer(layer: Layer, batch: int, impls: list[str], device: torch.device, warmup: int, min_runs: int,
                max_runs: int, budget_s: float, skipped: dict) -> dict:
    """{impl: (fwd summary, bwd summary)} with the impls interleaved run by run."""
    gen = torch.Generator().manual_seed(0)
    base = {k: v.to(device) for k, v in layer.inputs(batch, gen).items()}
    work = {}
    for impl in impls:
        tensors = {k: v.detach().clone().requires_grad_(k != "x" or layer.input_needs_grad) for k, v in base.items()}
        try:
            out = _call(layer, tensors, impl)   # builds / compiles / imports outside the timing
        except UserError as e:
            skipped[impl] = str(e)
            continue
        if out is None:
            continue
        work[impl] = (tensors, torch.randn(out.shape, generator=gen).to(device))
    samples = {impl: ([], []) for impl in work}

    def one_run(impl, record: bool):
        tensors, dy = work[impl]
        synchronize(device)
        t0 = time.perf_counter()
        out = _call(layer, tensors, impl)
        synchronize(device)
        t1 = time.perf_counter()
        grads = [t for t in tensors.values() if t.requires_grad]
        torch.autograd.grad(out, grads, dy)
        synchronize(device)
        t2 = time.perf_counter()
        if record:
            samples[impl][0].append(t1 - t0)
            samples[impl][1].append(t2 - t1)

    for _ in range(warmup):
        for impl in work:
            one_run(impl, record=False)
    start, runs = time.perf_counter(), 0
    while runs < max_runs and (runs < min_runs or time.perf_counter() - start < budget_s * len(work)):
        for impl in work:
            one_run(impl, record=True)
        runs += 1
    return {impl: (summarize(f), summarize(b)) for impl, (f, b) in samples.items()}


def run_layer_bench(batches=DEFAULT_BATCHES, impls=None, layers=None, device: str | torch.device = "cpu",
                    warmup: int = 2, min_runs: int = 5, max_runs: int = 200, budget_s: float = 1.0,
                    progress=None) -> dict:
    """Time every layer's forward and backward for each impl and batch. Returns a JSON-able dict."""
    device = torch.device(device)
    default_impls, skipped = available_impls(device)
    impls = list(impls or default_impls)
    for impl in impls:
        if impl not in IMPLS + ("cuda-atomic",):
            raise ConfigError(f"--impl {impl!r}: choose from {', '.join(IMPLS)}, cuda-atomic")
    if "aten" not in impls:
        impls.insert(0, "aten")   # the baseline every ratio is taken against
    if "cuda-atomic" in impls:
        from trainlab.ops import layers_cpp

        layers_cpp.require_cuda_build()
    chosen = [layer for layer in LAYERS if not layers or layer.name in layers]
    unknown = set(layers or ()) - set(LAYER_NAMES)
    if unknown:
        raise ConfigError(f"--layer {sorted(unknown)[0]!r}: choose from {', '.join(LAYER_NAMES)}")
    if any(b < 1 for b in batches):
        raise ConfigError(f"--batch {','.join(map(str, batches))}: batch sizes must be positive")
    rows = []
    for batch in batches:
        for layer in chosen:
            stats = _time_layer(layer, batch, impls, device, warmup, min_runs, max_runs, budget_s, skipped)
            base = stats["aten"]
            for impl, (fwd, bwd) in stats.items():
                row = {"layer": layer.name, "op": layer.op, "batch": batch, "impl": impl,
                       "fwd_median_s": fwd["median"], "fwd_p10_s": fwd["p10"], "fwd_p90_s": fwd["p90"],
                       "bwd_median_s": bwd["median"], "bwd_p10_s": bwd["p10"], "bwd_p90_s": bwd["p90"],
                       "runs": fwd["n"], "fwd_ratio_to_aten": fwd["median"] / base[0]["median"],
                       "bwd_ratio_to_aten": bwd["median"] / base[1]["median"],
                       "total_ratio_to_aten": (fwd["median"] + bwd["median"]) / (base[0]["median"] + base[1]["median"])}
                rows.append(row)
                if progress:
                    progress(row)
    return {"device": str(device), "torch_threads": torch.get_num_threads(), "batches": list(batches),
            "impls": impls, "layers": [layer.name for layer in chosen], "skipped": skipped, "rows": rows,
            "totals": _totals(rows)}


def _totals(rows: list[dict]) -> list[dict]:
    """Per batch and impl, the sum of the layers' medians: a LeNet-5 step's layer time."""
    out = {}
    for r in rows:
        t = out.setdefault((r["batch"], r["impl"]), {"batch": r["batch"], "impl": r["impl"], "fwd_s": 0.0, "bwd_s": 0.0})
        t["fwd_s"] += r["fwd_median_s"]
        t["bwd_s"] += r["bwd_median_s"]
    for t in out.values():
        base = out.get((t["batch"], "aten"))
        t["ratio_to_aten"] = (t["fwd_s"] + t["bwd_s"]) / (base["fwd_s"] + base["bwd_s"]) if base else None
    return list(out.values())


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}" if s < 0.1 else f"{s * 1e3:.1f}"


def format_table(result: dict) -> str:
    lines = [f"device {result['device']}  torch threads {result['torch_threads']}  "
             "(times in ms: median [p10–p90]; ratio = median / ATen's median)"]
    head = f"{'batch':>5}  {'layer':<6} {'impl':<11} {'forward':>26} {'x aten':>7} {'backward':>26} {'x aten':>7}"
    lines.append(head)
    for r in result["rows"]:
        fwd = f"{_ms(r['fwd_median_s'])} [{_ms(r['fwd_p10_s'])}–{_ms(r['fwd_p90_s'])}]"
        bwd = f"{_ms(r['bwd_median_s'])} [{_ms(r['bwd_p10_s'])}–{_ms(r['bwd_p90_s'])}]"
        lines.append(f"{r['batch']:>5}  {r['layer']:<6} {r['impl']:<11} {fwd:>26} {r['fwd_ratio_to_aten']:>7.2f} "
                     f"{bwd:>26} {r['bwd_ratio_to_aten']:>7.2f}")
    lines.append("")
    lines.append("all layers (sum of medians), per batch and impl:")
    for t in result["totals"]:
        ratio = f"{t['ratio_to_aten']:.2f}x aten" if t["ratio_to_aten"] is not None else ""
        lines.append(f"{t['batch']:>5}  {t['impl']:<11} fwd {_ms(t['fwd_s']):>8} ms  bwd {_ms(t['bwd_s']):>8} ms  "
                     f"total {_ms(t['fwd_s'] + t['bwd_s']):>8} ms  {ratio}")
    for impl, why in result["skipped"].items():
        lines.append(f"skipped {impl}: {why}")
    return "\n".join(lines)


def write_bench_results(out_dir, result: dict, table: str, command: str, stem: str = "ops_bench") -> dict:
    """<stem>.json/.md/.log through the shared result writer, headed by config and machine."""
    env = collect_env(result["device"])
    config = {"command": command, "device": result["device"], "batches": ",".join(map(str, result["batches"])),
              "torch_threads": result["torch_threads"]}
    text = f"{format_header(config, env)}\n\n{table}"
    return write_results(out_dir, stem, result, f"# LeNet-5 layer benchmark\n\n```\n{text}\n```", [text], command, env=env)
