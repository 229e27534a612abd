"""Where the Triton rung's host time goes on the GPU machine (device call 2, scratch)."""

import cProfile
import io
import pstats
import statistics
import time

import torch

from trainlab.ops import bench
from trainlab.ops.layers import layers_triton as lt

for name, (c, k, i) in list(lt.TUNING.items()):
    lt.TUNING[name] = (c[:1], k, i)
dev = torch.device("cuda")


def host(fn, n=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


def phases(layer, impl, batch=4096):
    gen = torch.Generator().manual_seed(0)
    t = {k: v.to(dev).requires_grad_(k != "x" or layer.input_needs_grad) for k, v in layer.inputs(batch, gen).items()}
    out = bench._call(layer, t, impl)
    dy = torch.randn(out.shape, generator=gen).to(dev)
    st = {}

    def f():
        st["o"] = bench._call(layer, t, impl)

    def b():
        torch.autograd.grad(st.pop("o"), [v for v in t.values() if v.requires_grad], dy)

    return f, b, t, dy


res = {}
for name in ("relu3", "fc3", "conv2+relu", "conv1"):
    layer = next(l for l in bench.LAYERS if l.name == name)
    for impl in ("aten", "triton"):
        f, b, t, dy = phases(layer, impl)
        res[f"{name} {impl} fwd"] = host(f)
        res[f"{name} {impl} fwd+bwd"] = host(lambda: (f(), b()))
        with torch.no_grad():
            res[f"{name} {impl} fwd no_grad"] = host(f)
# relu3 pieces, called directly on the main thread
x = torch.randn(4096, 120, device=dev)
y = torch.relu(x)
g = torch.randn_like(x)
res["relu_bwd op direct"] = host(lambda: torch.ops.trainlab.triton_relu_bwd(g, y))
res["relu_fwd op direct (no grad)"] = host(lambda: torch.ops.trainlab.triton_relu_fwd(x))
raw_b = getattr(lt.relu_bwd, "_init_fn", None)
if raw_b:
    res["relu_bwd python body"] = host(lambda: raw_b(g, y))


class PlainRelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = lt.relu_fwd._init_fn(x)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return lt.relu_bwd._init_fn(grad, out)


xr = x.clone().requires_grad_()
res["plain Function relu fwd+bwd"] = host(lambda: torch.autograd.grad(PlainRelu.apply(xr), [xr], g))
res["custom op relu fwd+bwd"] = host(lambda: torch.autograd.grad(torch.ops.trainlab.triton_relu_fwd(xr), [xr], g))
res["aten relu fwd+bwd"] = host(lambda: torch.autograd.grad(torch.relu(xr), [xr], g))
with torch.autograd.set_multithreading_enabled(False):
    for name in ("relu3", "conv2+relu"):
        layer = next(l for l in bench.LAYERS if l.name == name)
        for impl in ("aten", "triton"):
            f, b, t, dy = phases(layer, impl)
            res[f"{name} {impl} fwd+bwd, backward on the calling thread"] = host(lambda: (f(), b()))
    res["custom op relu fwd+bwd, calling thread"] = host(
        lambda: torch.autograd.grad(torch.ops.trainlab.triton_relu_fwd(xr), [xr], g)
    )
    res["plain Function relu fwd+bwd, calling thread"] = host(lambda: torch.autograd.grad(PlainRelu.apply(xr), [xr], g))
for k, v in res.items():
    print(f"{k:60s} {v:8.1f} us", flush=True)
# a profile of every thread (the backward runs on autograd's device thread)
layer = next(l for l in bench.LAYERS if l.name == "conv2+relu")
f, b, t, dy = phases(layer, "triton")
for _ in range(10):
    f()
    b()
torch.cuda.synchronize()
prof = cProfile.Profile()
with torch.autograd.set_multithreading_enabled(False):
    prof.enable()
    for _ in range(100):
        f()
        b()
    torch.cuda.synchronize()
    prof.disable()
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
print(s.getvalue()[:6000])
s = io.StringIO()
pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
print(s.getvalue()[:8000])
