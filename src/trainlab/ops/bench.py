"""`trainlab ops bench` (and its alias `trainlab gelu bench`): time every rung next to the aten rung, llm.c style.

Every measurement goes through one timer, `trainlab.stats.time_interleaved`: the rungs take turns
run by run (run 1 of every rung, then run 2, …), so a change in machine load hits all of them
alike; the tables report the median, the p10–p90 spread and the ratio of medians to aten. Warm-up
runs are excluded, and each rung runs once at full size before timing (build, JIT, import).

GELU: for each size, rung and pass (forward; forward+backward) the effective bandwidth counts the
bytes a fused kernel must move: forward reads x and writes y (2 N element-bytes), backward reads
grad and x and writes dx (3 N), so forward+backward is 5 N. On a GPU the measured device copy
bandwidth (y.copy_(x), 2 N) is reported as the ceiling.

Layers: every layer of LeNet-5 (conv1 … fc3 and the activations between them, at its real shape;
each operator's folder lists its own, `BENCH`, gathered through ops/registry.py), for every batch
size, its forward and — separately, in the same run — its backward (the gradients training needs:
conv1's input is data and gets none). The totals add the layers every rung timed, so each ratio
compares the same work, for two steps (STEPS): the layers one by one, and the step whose conv and
linear layers carry their ReLU (`conv1+relu` …: one kernel on the triton rung, what `train --ops
own=triton` runs; the layer then its ReLU on the others).

The `python` rung is timed like the others: its cost (several unfused passes over memory) is the
lesson. Triton on a CPU only runs under the interpreter, whose speed means nothing, so `triton` is
timed only on a GPU. On CUDA tensors `cpp` is not timed: the registered ops dispatch CUDA tensors
to the same kernels as `cuda`, so its row would be a second copy of that one. On a GPU the layer
bench also times `cuda-atomic`, the naive atomicAdd pool backward, next to the gather kernel. A
rung that cannot run (not built, not installed, out of memory at a size) is listed under `skipped`
with the error, and the others are still timed.
"""

from __future__ import annotations

import torch

from trainlab.device import synchronize
from trainlab.errors import ConfigError, UserError
from trainlab.ops import registry
from trainlab.ops.choices import DEFAULT_BATCHES, DEFAULT_SIZES, canonical_impls, format_size
from trainlab.ops.gelu import APPROXIMATIONS, gelu
from trainlab.ops.ladder import DTYPES, Layer
from trainlab.results.kinds import plan_record
from trainlab.stats import time_interleaved
from trainlab.telemetry.env import collect_env, format_header
from trainlab.telemetry.results import write_results

CPP_ON_CUDA = (
    "on CUDA tensors impl='cpp' dispatches to the same CUDA kernel as impl='cuda' "
    "(the op's CUDA key): timed once, as 'cuda'"
)


def available_impls(device: torch.device) -> tuple[list[str], dict]:
    """Rungs to time on `device`, and {rung: why not} for the others."""
    if device.type == "cuda":
        impls, skipped = ["aten", "python", "cuda"], {"cpp": CPP_ON_CUDA}
        try:
            import triton  # noqa: F401

            impls.append("triton")
        except ImportError:
            skipped["triton"] = "triton not installed"
        return impls, skipped
    return ["aten", "python", "cpp"], {
        "triton": "CPU: Triton only runs interpreted here; interpreter speed is meaningless",
        "cuda": "no CUDA GPU",
    }


def _impls(requested, device: torch.device, extra: tuple[str, ...] = ()) -> tuple[list[str], dict]:
    """The rungs to time (aten first: the baseline every ratio is taken against) and the skipped ones."""
    default, skipped = available_impls(device)
    impls = canonical_impls(requested, extra=extra) or default + list(extra if device.type == "cuda" else ())
    if "aten" not in impls:
        impls.insert(0, "aten")
    if device.type == "cuda" and "cpp" in impls:
        impls.remove("cpp")
        skipped["cpp"] = CPP_ON_CUDA
    return impls, skipped


def _error_line(e: BaseException) -> str:
    if isinstance(e, UserError):
        return str(e)
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


# ---- GELU: sizes x rungs x (fwd, fwd+bwd) ---------------------------------------------------------------


def run_gelu_bench(
    sizes=None,
    impls=None,
    dtype: str = "float32",
    approximate: str = "none",
    device: str | torch.device = "cpu",
    warmup: int = 3,
    min_runs: int = 5,
    max_runs: int = 200,
    budget_s: float = 0.5,
    progress=None,
) -> dict:
    """Time forward and forward+backward for each rung and size. Returns a JSON-able dict."""
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if approximate not in APPROXIMATIONS:
        raise ConfigError(f"--approximate {approximate!r}: choose one of {', '.join(APPROXIMATIONS)}")
    device = torch.device(device)
    sizes = list(sizes or DEFAULT_SIZES)
    impls, skipped = _impls(impls, device)
    dt = DTYPES[dtype]
    elem = torch.finfo(dt).bits // 8
    sync = lambda: synchronize(device)  # noqa: E731
    timing = dict(warmup=warmup, min_runs=min_runs, max_runs=max_runs, budget_s=budget_s, sync=sync)
    rows, copy_gbps = [], {}
    for n in sizes:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(n, generator=gen).to(dt).to(device)
        g = torch.randn(n, generator=gen).to(dt).to(device)
        if device.type == "cuda":
            out = torch.empty_like(x)
            s = time_interleaved({"copy": lambda: out.copy_(x)}, **timing)["copy"]
            copy_gbps[n] = 2 * n * elem / s["median"] / 1e9
            del out
        xr = {}
        for impl in impls:
            if impl in skipped and impl != "aten":
                continue  # failed at an earlier size
            try:  # build / JIT / import, and one full-size forward+backward, outside the timing
                xr[impl] = x.detach().clone().requires_grad_()
                gelu(xr[impl], impl=impl, approximate=approximate).backward(g)
                sync()
            except Exception as e:  # unavailable here, or failing at this size: report, time the rest
                if impl == "aten":
                    raise
                xr.pop(impl, None)
                skipped[impl] = _error_line(e) + f" (at {format_size(n)} elements)"

        def fwd(impl):
            def run():
                with torch.no_grad():
                    gelu(x, impl=impl, approximate=approximate)

            return run

        def fwd_bwd(impl):
            def run():
                xr[impl].grad = None
                gelu(xr[impl], impl=impl, approximate=approximate).backward(g)

            return run

        for pass_name, maker, nbytes in (("fwd", fwd, 2 * n * elem), ("fwd+bwd", fwd_bwd, 5 * n * elem)):
            stats = time_interleaved({impl: maker(impl) for impl in xr}, **timing)
            base = stats["aten"]["median"]
            for impl, st in stats.items():
                row = {
                    "size": n,
                    "impl": impl,
                    "pass": pass_name,
                    "dtype": dtype,
                    "approximate": approximate,
                    "median_s": st["median"],
                    "p10_s": st["p10"],
                    "p90_s": st["p90"],
                    "runs": st["n"],
                    "gbps": nbytes / st["median"] / 1e9,
                    "ratio_to_torch": st["median"] / base,  # to aten (F.gelu); the key the reports read
                    "copy_gbps": copy_gbps.get(n),
                    "pct_of_copy_bw": (nbytes / st["median"] / 1e9) / copy_gbps[n] if n in copy_gbps else None,
                }
                rows.append(row)
                if progress:
                    progress(row)
        xr.clear()  # the full-size copies go before the next size
    return {
        "device": str(device),
        "dtype": dtype,
        "approximate": approximate,
        "torch_threads": torch.get_num_threads(),
        "sizes": sizes,
        "impls": impls,
        "skipped": skipped,
        "rows": rows,
        "bytes_model": "fwd 2N, fwd+bwd 5N element-bytes (fused kernel minimum)",
        "triton_tuning": _tuning(impls),
    }


def format_gelu_table(result: dict) -> str:
    head = f"{'size':>6}  {'impl':<7} {'pass':<8} {'median':>10}  {'p10–p90':>21}  {'GB/s':>7}  {'x F.gelu':>8}"
    if result["device"].startswith("cuda"):
        head += f"  {'% copy':>6}"
    lines = [
        f"device {result['device']}  dtype {result['dtype']}  approximate {result['approximate']}  "
        f"torch threads {result['torch_threads']}",
        head,
    ]
    for r in result["rows"]:
        line = (
            f"{format_size(r['size']):>6}  {r['impl']:<7} {r['pass']:<8} {r['median_s'] * 1e3:>8.3f}ms  "
            f"{r['p10_s'] * 1e3:>9.3f}–{r['p90_s'] * 1e3:<9.3f}ms  {r['gbps']:>7.2f}  "
            f"{(r['ratio_to_torch'] or float('nan')):>8.2f}"
        )
        if r["pct_of_copy_bw"] is not None:
            line += f"  {100 * r['pct_of_copy_bw']:>5.0f}%"
        lines.append(line)
    return "\n".join(lines + [f"skipped {impl}: {why}" for impl, why in result["skipped"].items()])


# ---- layers: LeNet-5's layers x batch sizes x rungs, forward and backward ----------------------------

# Every operator's LeNet-5 layers (its folder's BENCH), in LeNet-5's order.
LAYERS = tuple(
    sorted((layer for op in registry.OPS for layer in registry.module(op).BENCH), key=lambda layer: layer.order)
)
LAYER_NAMES = tuple(layer.name for layer in LAYERS)


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


def layer_phases(layer: Layer, base: dict, impl: str, device: torch.device, gen: torch.Generator):
    """(forward, backward) of `layer` on rung `impl`, over leaves cloned from `base` and a dy drawn from
    `gen`; None where the rung has no kernel for the layer. The first call (a build, compile or import)
    runs here, outside any timing."""
    tensors = {k: v.detach().clone().requires_grad_(k != "x" or layer.input_needs_grad) for k, v in base.items()}
    out = _call(layer, tensors, impl)
    if out is None:
        return None
    state = {"dy": torch.randn(out.shape, generator=gen).to(device)}

    def forward():
        state["out"] = _call(layer, tensors, impl)

    def backward():
        torch.autograd.grad(state.pop("out"), [t for t in tensors.values() if t.requires_grad], state["dy"])

    return forward, backward


def _time_layer(layer: Layer, batch: int, impls: list[str], device: torch.device, skipped: dict, **timing) -> dict:
    """{impl: [fwd summary, bwd summary]}, the rungs interleaved run by run."""
    gen = torch.Generator().manual_seed(0)
    base = {k: v.to(device) for k, v in layer.inputs(batch, gen).items()}
    phases = {}
    for impl in impls:
        try:
            ph = layer_phases(layer, base, impl, device, gen)
        except UserError as e:
            skipped[impl] = str(e)
            continue
        if ph is not None:
            phases[impl] = ph
    return time_interleaved(phases, sync=lambda: synchronize(device), **timing)


def run_layer_bench(
    batches=DEFAULT_BATCHES,
    impls=None,
    layers=None,
    device: str | torch.device = "cpu",
    warmup: int = 2,
    min_runs: int = 5,
    max_runs: int = 200,
    budget_s: float = 1.0,
    progress=None,
) -> dict:
    """Time every layer's forward and backward for each rung and batch. Returns a JSON-able dict."""
    device = torch.device(device)
    impls, skipped = _impls(impls, device, extra=("cuda-atomic",))
    if "cuda-atomic" in impls:
        from trainlab.ops.build import LIBRARY  # the layer ops register when their rung is first used

        LIBRARY.require_cuda()
    names = [layer.name for layer in LAYERS]
    unknown = set(layers or ()) - set(names)
    if unknown:
        raise ConfigError(f"--layer {sorted(unknown)[0]!r}: choose from {', '.join(names)}")
    if any(b < 1 for b in batches):
        raise ConfigError(f"--batch {','.join(map(str, batches))}: batch sizes must be positive")
    chosen = [layer for layer in LAYERS if not layers or layer.name in layers]
    rows = []
    for batch in batches:
        for layer in chosen:
            stats = _time_layer(
                layer,
                batch,
                impls,
                device,
                skipped,
                warmup=warmup,
                min_runs=min_runs,
                max_runs=max_runs,
                budget_s=budget_s,
            )
            base = stats["aten"]
            for impl, (fwd, bwd) in stats.items():
                row = {
                    "layer": layer.name,
                    "op": layer.op,
                    "batch": batch,
                    "impl": impl,
                    "fwd_median_s": fwd["median"],
                    "fwd_p10_s": fwd["p10"],
                    "fwd_p90_s": fwd["p90"],
                    "bwd_median_s": bwd["median"],
                    "bwd_p10_s": bwd["p10"],
                    "bwd_p90_s": bwd["p90"],
                    "runs": fwd["n"],
                    "fwd_ratio_to_aten": fwd["median"] / base[0]["median"],
                    "bwd_ratio_to_aten": bwd["median"] / base[1]["median"],
                    "total_ratio_to_aten": (fwd["median"] + bwd["median"]) / (base[0]["median"] + base[1]["median"]),
                }
                rows.append(row)
                if progress:
                    progress(row)
    return {
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "batches": list(batches),
        "impls": impls,
        "layers": [layer.name for layer in chosen],
        "skipped": skipped,
        "rows": rows,
        "totals": _totals(rows),
        "triton_tuning": _tuning(impls),
    }


def _tuning(impls) -> dict:
    """The Triton rung's autotuning choices (ops.gelu.gelu_triton.tuning_choices) when it ran, else {}."""
    if "triton" not in impls:
        return {}
    from trainlab.ops.gelu.gelu_triton import tuning_choices

    return tuning_choices()


PARTIAL = {"cuda-atomic": "max_pool2d"}  # rungs that time one operator's layers only, by design
STEPS = ("layers", "relu-epilogue")  # the step totals (ladder.Layer.steps)


def _totals(rows: list[dict]) -> list[dict]:
    """Per batch, step (STEPS) and rung, the sum of the layers' medians: a LeNet-5 step's layer time.
    Every total sums the same layers as the aten total it is divided by: the step's layers every
    rung timed at that batch (a rung that failed at one layer shrinks them for all), and for a rung
    that times one operator only by design (cuda-atomic: the pools), that operator's layers."""
    return [
        t
        for batch in dict.fromkeys(r["batch"] for r in rows)
        for step in STEPS
        for t in _step_totals(rows, batch, step)
    ]


def _step_totals(rows: list[dict], batch: int, step: str) -> list[dict]:
    in_step = {layer.name for layer in LAYERS if step in layer.steps}
    out = []
    timed: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r["batch"] == batch and r["layer"] in in_step:
            timed.setdefault(r["impl"], {})[r["layer"]] = r
    full = [impl for impl in timed if impl not in PARTIAL]
    common = set.intersection(*(set(timed[i]) for i in full)) if full else set()
    for impl, by_layer in timed.items():
        layers = common if impl not in PARTIAL else set(by_layer) & set(timed.get("aten", {}))
        if not layers or (impl in PARTIAL and step != STEPS[0]):  # a one-operator rung: one line is enough
            continue
        fwd, bwd = (sum(by_layer[n][k] for n in layers) for k in ("fwd_median_s", "bwd_median_s"))
        base = timed.get("aten", {})
        base_s = sum(base[n]["fwd_median_s"] + base[n]["bwd_median_s"] for n in layers) if layers <= set(base) else None
        out.append(
            {
                "batch": batch,
                "step": step,
                "impl": impl,
                "fwd_s": fwd,
                "bwd_s": bwd,
                "layers": [layer.name for layer in LAYERS if layer.name in layers],
                "ratio_to_aten": (fwd + bwd) / base_s if base_s else None,
            }
        )
    return out


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}" if s < 0.1 else f"{s * 1e3:.1f}"


def format_layer_table(result: dict) -> str:
    lines = [
        f"device {result['device']}  torch threads {result['torch_threads']}  "
        "(times in ms: median [p10–p90]; ratio = median / ATen's median)",
        f"{'batch':>5}  {'layer':<10} {'impl':<11} {'forward':>26} {'x aten':>7} {'backward':>26} {'x aten':>7}",
    ]
    for r in result["rows"]:
        fwd = f"{_ms(r['fwd_median_s'])} [{_ms(r['fwd_p10_s'])}–{_ms(r['fwd_p90_s'])}]"
        bwd = f"{_ms(r['bwd_median_s'])} [{_ms(r['bwd_p10_s'])}–{_ms(r['bwd_p90_s'])}]"
        lines.append(
            f"{r['batch']:>5}  {r['layer']:<10} {r['impl']:<11} {fwd:>26} {r['fwd_ratio_to_aten']:>7.2f} "
            f"{bwd:>26} {r['bwd_ratio_to_aten']:>7.2f}"
        )
    lines += [
        "",
        "layers summed (sum of medians; each ratio over the same layers for aten), per batch, step and impl:",
        "  layers: one by one;  relu-epilogue: conv/linear with their ReLU (one kernel on triton), pools, fc3",
    ]
    common = {(t["batch"], t.get("step")): t.get("layers") for t in result["totals"] if t["impl"] == "aten"}
    for t in result["totals"]:
        ratio = f"{t['ratio_to_aten']:.2f}x aten" if t["ratio_to_aten"] is not None else ""
        which, step = t.get("layers"), t.get("step", "layers")
        label = "" if which is None or which == common.get((t["batch"], step)) else f"  ({', '.join(which)} only)"
        lines.append(
            f"{t['batch']:>5}  {step:<13} {t['impl']:<11} fwd {_ms(t['fwd_s']):>8} ms  bwd {_ms(t['bwd_s']):>8} ms  "
            f"total {_ms(t['fwd_s'] + t['bwd_s']):>8} ms  {ratio}{label}"
        )
    return "\n".join(lines + [f"skipped {impl}: {why}" for impl, why in result["skipped"].items()])


def write_bench_results(out_dir, result: dict, table: str, command: str, stem: str = "gelu_bench") -> dict:
    """<stem>.json/.md/.log through the shared result writer: the table, headed by config and machine."""
    env = collect_env(result["device"])
    plan = bench_plan(result, command, env)
    config = plan["resolved"]
    title = "GELU benchmark" if "sizes" in result else "LeNet-5 layer benchmark"
    text = f"{format_header(config, env)}\n\n{table}"
    return write_results(
        out_dir, stem, result, f"# {title}\n\n```\n{text}\n```", [text], command, kind=stem, plan=plan, env=env
    )


def bench_plan(result: dict, command: str, env: dict | None = None) -> dict:
    """The record's plan of a bench result (the files under --out and the --json copy carry the same)."""
    env = env if env is not None else collect_env(result["device"])
    config = {"command": command, "device": result["device"], "torch_threads": result["torch_threads"]}
    if "sizes" in result:
        config.update(
            dtype=result["dtype"],
            approximate=result["approximate"],
            sizes=",".join(format_size(s) for s in result["sizes"]),
        )
    else:
        config["batches"] = ",".join(map(str, result["batches"]))
    return plan_record(
        str(result["device"]),
        device_name=env["gpus"][0] if str(result["device"]).startswith("cuda") and env["gpus"] else env["cpu"],
        precision=result.get("dtype"),
        threads=result["torch_threads"],
        resolved=config,
    )
