"""Where each rung's layer time goes on a GPU: kernel time against host time, per LeNet-5 layer.

`trainlab ops bench` times a layer's forward and backward the way a user calls them once: synchronize,
call, synchronize. On a GPU that wall time is the kernels' time plus the host's (Python, the
dispatcher, Triton's launcher) wherever the GPU waits for the host. This splits the two, per layer and
rung, in one process:

  wall      median of synchronize → phase → synchronize (as `ops bench`)
  queued    the same phase called `--queued` times back to back with one synchronize at the end, per call:
            the steady state of a training loop, where the host runs ahead of the GPU
  kernels   the GPU kernels' own time per call (torch.profiler), each kernel named
  host      the host's time per call without any synchronize (CPU time of issuing the phase)

Every rung runs at torch's default precision switches (cuDNN's convolutions in TF32, cuBLAS's matmuls in
IEEE float32; the Triton rung follows the same switches), and with `--ieee` once more with both off
(rows `IMPL-ieee`), so each precision is compared with its like. `--untuned` times every
Triton kernel at its first config (no autotuning: minutes less on a fresh machine).

    PYTHONPATH=src python3 benchmarks/gpu_layer_profile.py --out DIR [--batch 4096] [--untuned] [--ieee] [--launch]
    PYTHONPATH=src python3 benchmarks/gpu_layer_profile.py --out DIR --dry-run   # on a CPU: toy sizes, checks it runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from _common import add_output_args, check_output, save

from trainlab.ops import bench
from trainlab.ops.layers import layers_triton


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _phases(layer, batch: int, impl: str, device):
    """`ops bench`'s forward and backward of the layer (bench.layer_phases), its inputs drawn as there."""
    gen = torch.Generator().manual_seed(0)
    base = {k: v.to(device) for k, v in layer.inputs(batch, gen).items()}
    phases = bench.layer_phases(layer, base, impl, device, gen)
    if phases is None:
        raise ValueError(f"rung {impl!r} has no kernel for {layer.name}")
    return phases


def _kernels(fn, runs: int) -> tuple[float, dict]:
    """(kernel seconds per call, {kernel name: seconds per call}) of `fn`, by torch.profiler (none on a CPU)."""
    if not torch.cuda.is_available():
        return 0.0, {}
    from torch.profiler import ProfilerActivity, profile

    _sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        _sync()
    names: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name] = names.get(e.name, 0.0) + e.time_range.elapsed_us() * 1e-6 / runs
    return sum(names.values()), names


def _measure(fn, runs: int, queued: int) -> dict:
    for _ in range(3):
        fn()
    _sync()
    wall, host = [], []
    for _ in range(runs):
        _sync()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        _sync()
        wall.append(time.perf_counter() - t0)
        host.append(t1 - t0)
    _sync()
    t0 = time.perf_counter()
    for _ in range(queued):
        fn()
    _sync()
    q = (time.perf_counter() - t0) / queued
    k, names = _kernels(fn, 10)
    return {"wall": statistics.median(wall), "host": statistics.median(host), "queued": q, "kernels": k, "names": names}


def _host_per_call(fn, calls: int) -> float:
    for _ in range(min(50, calls)):
        fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = (time.perf_counter() - t0) / calls
    _sync()
    return t


def _gelu_costs(device) -> dict:
    import torch.nn.functional as F

    from trainlab.ops.gelu import gelu_triton as gt

    x = torch.randn(256 * 2**20 if device.type == "cuda" else 1024, device=device)
    y = torch.empty_like(x)
    res = {}
    for name, fn in (
        ("copy", lambda: y.copy_(x)),
        ("aten gelu", lambda: F.gelu(x)),
        ("triton gelu", lambda: gt.gelu_fwd_triton(x, "none")),
    ):
        m = _measure(fn, 30 if device.type == "cuda" else 1, 30 if device.type == "cuda" else 1)
        res[f"gelu256M {name}"] = {k: m[k] for k in ("wall", "host", "queued", "kernels")}
    return res


def _launch_costs(device) -> dict:
    """GELU fp32 at 256M (wall, kernel) beside a copy; the host's cost per call of one small launch by
    each path from the op to the kernel."""

    from trainlab.ops.gelu import gelu_triton as gt

    res = _gelu_costs(device)
    small = torch.randn(4096, device=device)
    out = torch.empty_like(small)
    gpu = device.type == "cuda"
    tuner = layers_triton.tuned_kernel("_relu_fwd_kernel", not gpu)
    grid = lambda meta: (-(-small.numel() // meta["BLOCK"]),)  # noqa: E731
    jit = tuner.fn
    paths = {
        "aten relu": lambda: torch.relu(small),
        "torch.ops.trainlab.triton_relu_fwd": lambda: torch.ops.trainlab.triton_relu_fwd(small),
        "layers_triton.relu (rung entry)": lambda: layers_triton.relu(small),
        "autotuner launch": lambda: tuner[grid](small, out, small.numel(), F64=False),
        "jit launch, fixed config": lambda: jit[(1,)](small, out, small.numel(), F64=False, BLOCK=4096, num_warps=4),
        "torch.empty_like": lambda: torch.empty_like(small),
        "gelu_fwd_triton 4096": lambda: gt.gelu_fwd_triton(small, "none"),
    }
    res["host_us_per_call"] = {k: _host_per_call(fn, 2000 if gpu else 2) * 1e6 for k, fn in paths.items()}
    for k, v in res.items():
        print(k, v, flush=True)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_args(p)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--queued", type=int, default=50)
    p.add_argument("--impls", default="aten,cuda,triton")
    p.add_argument("--ieee", action="store_true", help="each rung once more with TF32 off in cuDNN and cuBLAS")
    p.add_argument("--layers", default="")
    p.add_argument("--untuned", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU: checks that it runs")
    p.add_argument("--launch", action="store_true", help="also GELU at 256M and the host cost of one launch")
    a = p.parse_args(argv)
    for flag in ("batch", "runs", "queued"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} {getattr(a, flag)}: expected a positive integer")
    names = {la.name for la in bench.LAYERS}
    unknown = sorted(set(filter(None, a.layers.split(","))) - names)
    if unknown:
        p.error(f"--layers {unknown[0]!r}: choose from {', '.join(sorted(names))}")
    bad = sorted(set(filter(None, a.impls.split(","))) - {"aten", "cuda", "triton"}) or not a.impls.strip(",")
    if bad:
        p.error(f"--impls {a.impls!r}: expected a comma-separated list of aten, cuda, triton")
    if not torch.cuda.is_available() and not a.dry_run:
        print(
            "gpu_layer_profile: needs a CUDA GPU (--dry-run: toy sizes on the CPU, Triton interpreted)", file=sys.stderr
        )
        return 2
    if a.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
        a.batch, a.runs, a.queued, a.impls = 2, 1, 1, "aten,triton"
    if a.untuned:
        for name, (configs, key, interp) in list(layers_triton.TUNING.items()):
            layers_triton.TUNING[name] = (configs[:1], key, interp)
    out = check_output(a.out, "layer_profile", force=a.force)
    device = torch.device("cpu" if a.dry_run else "cuda")
    layers = [la for la in bench.LAYERS if not a.layers or la.name in a.layers.split(",")]
    impls = [i for i in a.impls.split(",") if i]
    rows = []

    def run(label, impl):
        for layer in layers:
            t0 = time.perf_counter()
            try:
                fwd, bwd = _phases(layer, a.batch, impl, device)
            except Exception as e:  # a rung that cannot run this layer: its row says why
                rows.append({"layer": layer.name, "impl": label, "error": f"{type(e).__name__}: {e}"})
                continue
            for phase, fn in (("fwd", fwd), ("bwd", lambda: (fwd(), bwd()))):
                m = _measure(fn, a.runs, a.queued)
                if phase == "bwd":  # the backward alone: fwd+bwd minus the forward measured just before
                    for k in ("wall", "host", "queued", "kernels"):
                        m[k] -= rows[-1][k]
                    m["names"] = {n: s - rows[-1]["names"].get(n, 0.0) for n, s in m["names"].items()}
                rows.append({"layer": layer.name, "impl": label, "phase": phase, **m})
            print(f"{label:12s} {layer.name:11s} {time.perf_counter() - t0:6.1f} s", flush=True)

    for impl in impls:
        run(impl, impl)
    if a.ieee:
        from trainlab.device import ieee_float32

        with ieee_float32():
            for impl in impls:
                run(f"{impl}-ieee", impl)
    extra = _launch_costs(device) if a.launch else {}
    data = {"batch": a.batch, "untuned": a.untuned, "rows": rows, **extra}
    lines = [
        f"# layer profile, batch {a.batch}{' (Triton untuned: first config)' if a.untuned else ''}",
        "",
        "| layer | phase | impl | wall ms | queued ms | kernels ms | host ms | top kernels (ms) |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['layer']} | | {r['impl']} | {r['error']} |")
            continue
        top = sorted(r["names"].items(), key=lambda kv: -kv[1])[:3]
        tops = "; ".join(f"{n[:50]} {s * 1e3:.3f}" for n, s in top)
        lines.append(
            f"| {r['layer']} | {r['phase']} | {r['impl']} | {r['wall'] * 1e3:.3f} | {r['queued'] * 1e3:.3f} | "
            f"{r['kernels'] * 1e3:.3f} | {r['host'] * 1e3:.3f} | {tops} |"
        )
    totals = {}
    for r in rows:
        if "error" not in r:
            t = totals.setdefault(r["impl"], {"wall": 0.0, "queued": 0.0, "kernels": 0.0, "host": 0.0})
            for k in t:
                t[k] += r[k]
    lines += ["", "| impl | wall ms | queued ms | kernels ms | host ms |", "|---|---:|---:|---:|---:|"]
    lines += [
        f"| {i} | " + " | ".join(f"{t[k] * 1e3:.3f}" for k in ("wall", "queued", "kernels", "host")) + " |"
        for i, t in totals.items()
    ]
    print("\n".join(lines[-len(totals) - 2 :]))
    save("layer_profile", data, "\n".join(lines), lines, device, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
