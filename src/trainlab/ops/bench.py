"""`trainlab gelu bench`: time every GELU implementation next to F.gelu, llm.c style.

For each size, impl and pass (forward; forward+backward) the harness reports the median and the
p10–p90 spread of many synchronized runs (warm-up runs excluded), the effective bandwidth and the
ratio to F.gelu. Effective bandwidth counts the bytes a fused kernel must move: forward reads x and
writes y (2 N bytes-per-element), backward reads grad and x and writes dx (3 N), so forward+backward
is 5 N. On a GPU the measured device copy bandwidth (y.copy_(x), 2 N) is reported as the ceiling.

The `python` impl is timed like the others — its cost (several unfused passes over memory) is the
point of the comparison. Triton on CPU only runs under the interpreter, whose speed means nothing,
so it is benchmarked only on a GPU. On CUDA tensors `cpp` is not timed: the registered op
`trainlab::gelu_fwd` dispatches CUDA tensors to the same kernel as `cuda`, so its row would be a
second copy of that one. An impl that cannot run (not built, not installed, out of memory at a size)
is listed under `skipped` with the error, and the others are still timed.
"""

from __future__ import annotations

import re
import time

import torch

from trainlab.device import synchronize
from trainlab.errors import ConfigError, UserError
from trainlab.ops.gelu import APPROXIMATIONS, gelu
from trainlab.stats import summarize
from trainlab.telemetry.env import collect_env, format_header
from trainlab.telemetry.results import write_results

DEFAULT_SIZES = [2**10, 2**14, 2**18, 2**20, 2**22, 2**24, 2**26]   # 1K … 64M elements
QUICK_SIZES = [2**10, 2**16, 2**20]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def parse_size(text: str) -> int:
    """'1K' -> 1024, '16M' -> 16777216, '1000' -> 1000 (binary K/M/G)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise ConfigError(f"--sizes {text!r}: expected a number with an optional K/M/G suffix, e.g. 1K,16M")
    n = int(m.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[m.group(2).lower()]
    if n <= 0:
        raise ConfigError(f"--sizes {text!r}: sizes must be positive")
    return n


def format_size(n: int) -> str:
    for unit, v in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= v and n % v == 0:
            return f"{n // v}{unit}"
    return str(n)


def _time_interleaved(fns: dict, device, warmup: int, min_runs: int, max_runs: int, budget_s: float) -> dict:
    """Synchronized wall time of each fn in `fns`, taken round-robin (run 1 of every fn, then run 2…)
    so that a change in machine load hits all impls alike — on a shared CPU this matters more than
    the number of runs. Warm-up runs are excluded. Returns {name: summarize(samples)}."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    start = time.perf_counter()
    runs = 0
    while runs < max_runs and (runs < min_runs or time.perf_counter() - start < budget_s * len(fns)):
        for name, fn in fns.items():
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            samples[name].append(time.perf_counter() - t0)
        runs += 1
    return {k: summarize(v) for k, v in samples.items()}


CPP_ON_CUDA = ("on CUDA tensors impl='cpp' dispatches to the same CUDA kernel as impl='cuda' "
               "(trainlab::gelu_fwd's CUDA key): timed once, as 'cuda'")


def available_impls(device: torch.device) -> tuple[list[str], dict]:
    """Impls to time on `device`, and {impl: reason} for those skipped."""
    skipped = {}
    impls = ["torch", "python"]
    if device.type == "cuda":
        impls += ["cuda"]
        skipped["cpp"] = CPP_ON_CUDA
        try:
            import triton  # noqa: F401
            impls.append("triton")
        except ImportError:
            skipped["triton"] = "triton not installed"
    else:
        impls += ["cpp"]
        skipped["triton"] = "CPU: Triton only runs interpreted here; interpreter speed is meaningless"
        skipped["cuda"] = "no CUDA GPU"
    return impls, skipped


def _error_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


def run_bench(sizes=None, impls=None, dtype: str = "float32", approximate: str = "none",
              device: str | torch.device = "cpu", warmup: int = 3, min_runs: int = 5, max_runs: int = 200,
              budget_s: float = 0.5, progress=None) -> dict:
    """Time forward and forward+backward for each impl and size. Returns a JSON-able dict."""
    if dtype not in _DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: choose one of {', '.join(_DTYPES)}")
    if approximate not in APPROXIMATIONS:
        raise ConfigError(f"--approximate {approximate!r}: choose one of {', '.join(APPROXIMATIONS)}")
    device = torch.device(device)
    sizes = list(sizes or DEFAULT_SIZES)
    default_impls, skipped = available_impls(device)
    impls = list(impls or default_impls)
    if "torch" not in impls:
        impls.insert(0, "torch")   # the baseline every ratio is taken against
    if device.type == "cuda" and "cpp" in impls:
        impls.remove("cpp")
        skipped["cpp"] = CPP_ON_CUDA
    dt = _DTYPES[dtype]
    elem = torch.finfo(dt).bits // 8
    rows = []
    copy_gbps = {}
    for n in sizes:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(n, generator=gen).to(dt).to(device)
        g = torch.randn(n, generator=gen).to(dt).to(device)
        if device.type == "cuda":
            out = torch.empty_like(x)
            s = _time_interleaved({"copy": lambda: out.copy_(x)}, device, warmup, min_runs, max_runs, budget_s)["copy"]
            copy_gbps[n] = 2 * n * elem / s["median"] / 1e9
            del out
        runnable = []
        xr = {}
        for impl in impls:
            if impl in skipped and impl != "torch":
                continue   # failed at an earlier size
            try:   # build / JIT / import, and one full-size forward+backward, outside the timing
                xr[impl] = x.detach().clone().requires_grad_()
                gelu(xr[impl], impl=impl, approximate=approximate).backward(g)
                synchronize(device)
                runnable.append(impl)
            except Exception as e:   # unavailable here, or failing at this size: report, time the rest
                if impl == "torch":
                    raise
                xr.pop(impl, None)
                skipped[impl] = (str(e) if isinstance(e, UserError) else _error_line(e)) + f" (at {format_size(n)} elements)"

        def make_fwd(impl):
            def fwd():
                with torch.no_grad():
                    gelu(x, impl=impl, approximate=approximate)
            return fwd

        def make_fwd_bwd(impl):
            def fwd_bwd():
                xr[impl].grad = None
                gelu(xr[impl], impl=impl, approximate=approximate).backward(g)
            return fwd_bwd

        for pass_name, maker, nbytes in (("fwd", make_fwd, 2 * n * elem), ("fwd+bwd", make_fwd_bwd, 5 * n * elem)):
            stats = _time_interleaved({impl: maker(impl) for impl in runnable}, device, warmup, min_runs, max_runs, budget_s)
            base = stats["torch"]["median"]
            for impl in runnable:
                st = stats[impl]
                row = {"size": n, "impl": impl, "pass": pass_name, "dtype": dtype, "approximate": approximate,
                       "median_s": st["median"], "p10_s": st["p10"], "p90_s": st["p90"], "runs": st["n"],
                       "gbps": nbytes / st["median"] / 1e9,
                       "ratio_to_torch": st["median"] / base,
                       "copy_gbps": copy_gbps.get(n),
                       "pct_of_copy_bw": (nbytes / st["median"] / 1e9) / copy_gbps[n] if n in copy_gbps else None}
                rows.append(row)
                if progress:
                    progress(row)
        del xr
    return {"device": str(device), "dtype": dtype, "approximate": approximate, "torch_threads": torch.get_num_threads(),
            "sizes": sizes, "impls": impls, "skipped": skipped, "rows": rows,
            "bytes_model": "fwd 2N, fwd+bwd 5N element-bytes (fused kernel minimum)"}


def format_table(result: dict) -> str:
    head = f"{'size':>6}  {'impl':<7} {'pass':<8} {'median':>10}  {'p10–p90':>21}  {'GB/s':>7}  {'x F.gelu':>8}"
    if result["device"].startswith("cuda"):
        head += f"  {'% copy':>6}"
    lines = [f"device {result['device']}  dtype {result['dtype']}  approximate {result['approximate']}  "
             f"torch threads {result['torch_threads']}", head]
    for r in result["rows"]:
        line = (f"{format_size(r['size']):>6}  {r['impl']:<7} {r['pass']:<8} {r['median_s'] * 1e3:>8.3f}ms  "
                f"{r['p10_s'] * 1e3:>9.3f}–{r['p90_s'] * 1e3:<9.3f}ms  {r['gbps']:>7.2f}  "
                f"{(r['ratio_to_torch'] or float('nan')):>8.2f}")
        if r["pct_of_copy_bw"] is not None:
            line += f"  {100 * r['pct_of_copy_bw']:>5.0f}%"
        lines.append(line)
    for impl, why in result["skipped"].items():
        lines.append(f"skipped {impl}: {why}")
    return "\n".join(lines)


def write_bench_results(out_dir, result: dict, table: str, command: str, stem: str = "gelu_bench") -> dict:
    """<stem>.json/.md/.log through the shared result writer: the table, headed by config and machine."""
    env = collect_env(result["device"])
    config = {"command": command, "device": result["device"], "dtype": result["dtype"],
              "approximate": result["approximate"], "sizes": ",".join(format_size(s) for s in result["sizes"])}
    text = f"{format_header(config, env)}\n\n{table}"
    return write_results(out_dir, stem, result, f"# GELU benchmark\n\n```\n{text}\n```", [text], command, env=env)
