"""Numbers for people: 99.33 %, 25.5 s, 12,822 img/s, 0.0209 — never a raw float like 99.33000183105469.

One function per kind of quantity, so the same quantity looks the same everywhere on the page; each
returns "–" for a missing value. The raw values stay in the run directory (and in the report's
"raw values" blocks) for anyone who needs every digit.
"""

from __future__ import annotations

import math
import re

MISSING = "–"


def is_number(v) -> bool:
    """A real number (not a bool, not NaN or ±inf): what arithmetic on a file's value needs."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _numeric(fn):
    """A value that is not a number (a hand-edited or damaged file) is shown as the text it is, not
    formatted as a quantity and never a crash: the page shows what the file holds."""
    import functools

    @functools.wraps(fn)
    def wrapper(v, *args, **kwargs):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return str(v)
        return fn(v, *args, **kwargs)

    return wrapper


@_numeric
def pct(v, digits: int = 2) -> str:
    """An accuracy or a share in percent: 99.33 %."""
    return MISSING if _missing(v) else f"{v:.{digits}f} %"


@_numeric
def pct_sd(mean, sd, digits: int = 2) -> str:
    """Mean ± standard deviation in percent: 99.19 ± 0.12 %."""
    if _missing(mean):
        return MISSING
    return f"{mean:.{digits}f} ± {sd:.{digits}f} %" if not _missing(sd) else pct(mean, digits)


@_numeric
def seconds(v) -> str:
    """A duration: 412 ms, 2.35 s, 25.5 s, 312 s, 1 h 02 min."""
    if _missing(v):
        return MISSING
    if v == 0:
        return "0 s"
    if v < 1:
        return f"{v * 1e3:.3g} ms"
    if v < 10:
        return f"{v:.2f} s"
    if v < 100:
        return f"{v:.1f} s"
    if v < 3600:
        return f"{v:.0f} s"
    h, rest = divmod(int(round(v)), 3600)
    return f"{h} h {rest // 60:02d} min"


@_numeric
def millis(v) -> str:
    """A per-step time in milliseconds: 0.142 ms, 25.5 ms, 312 ms."""
    if _missing(v):
        return MISSING
    return f"{v:.3g} ms" if v < 100 else f"{v:,.0f} ms"


@_numeric
def rate(v, unit: str = "img/s") -> str:
    """A throughput with thousands separators: 12,822 img/s (three significant digits below 100)."""
    if _missing(v):
        return MISSING
    return f"{v:,.0f} {unit}" if abs(v) >= 100 else f"{v:.3g} {unit}"


def number(v) -> str:
    """A loss, an error, a ratio: three significant digits (0.0209, 1.23e-07, 2.31); integers with
    separators (61,706); booleans as yes/no; strings as they are."""
    if _missing(v):
        return MISSING
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1e5 or abs(v) < 1e-3:
            return f"{v:.3g}"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


@_numeric
def count(v) -> str:
    return MISSING if _missing(v) else f"{int(v):,}"


@_numeric
def nbytes(v) -> str:
    """Bytes in binary units: 241 KiB, 1.5 MiB, 59.7 GiB."""
    if _missing(v):
        return MISSING
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= size:
            return f"{v / size:.3g} {unit}"
    return f"{int(v)} B"


def value(key: str, v) -> str:
    """Format a value by what its key says it is (the result files' naming conventions)."""
    if _missing(v):
        return MISSING
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return number(v)
    k = key.lower()
    if k in ("mfu", "pct_of_copy_bw"):
        # fractions in the files (gelu bench's pct_of_copy_bw is one too, despite its name: 0.97 is 97 %);
        # a percentage everywhere people read them, as the CLIs print them
        return pct(100.0 * v, 1)
    if "bytes" in k:
        return nbytes(v) + ("/step" if "per_step" in k else "")
    if "accuracy" in k or k.endswith(("_pct", "pct_of_link")) or k == "mfu_pct":
        return pct(v)
    if re.search(r"per_s(_|$)", k):  # before the durations: "images_per_s" also ends with "_s"
        return rate(v, "tokens/s" if "tokens" in k else "img/s" if "image" in k else "/s")
    if k.endswith("_ms") or "_ms_" in k:
        return millis(v)
    if k.endswith("seconds") or "_seconds_" in k:  # whole durations stay in seconds: 0.379 s, 25.5 s
        return f"{v:.3g} s" if abs(v) < 1000 else f"{v:,.0f} s"
    if k.endswith("_s"):
        return seconds(v)
    return number(v)


# Column headers for people: the result files' keys, named and with their unit.
HEADERS = {
    "impl": "implementation",
    "approximate": "approximation",
    "dtype": "dtype",
    "op": "operator",
    "case": "case",
    "fwd_max_abs_err": "forward max |error|",
    "grad_max_abs_err": "gradient max |error|",
    "recipe_loss_diff": "|Δloss|",
    "recipe_grad_mse": "gradient MSE",
    "gradcheck": "gradcheck",
    "gradgradcheck": "gradgradcheck",
    "status": "status",
    "size": "elements",
    "pass": "pass",
    "median_s": "median time",
    "p10_s": "p10",
    "p90_s": "p90",
    "gbps": "GB/s",
    "ratio_to_torch": "time / F.gelu",
    "pct_of_copy_bw": "% of copy bandwidth",
    "mode": "mode",
    "world_size": "ranks",
    "loader": "loader",
    "workers": "DataLoader workers",
    "epoch_seconds": "epoch time",
    "images_per_s": "throughput",
    "data_ms": "data (ms/step)",
    "compute_ms": "compute (ms/step)",
    "comm_ms": "communication (ms/step)",
    "comm_overlapped": "communication overlapped",
    "test_accuracy": "test accuracy",
    "grad_bytes": "gradient size",
    "bytes_sent_per_step": "sent per step",
    "allreduce_ms": "all-reduce (ms)",
    "bound_comm_ms": "bound (ms)",
    "algbw_gbps": "algorithm bandwidth (GB/s)",
    "busbw_gbps": "bus bandwidth (GB/s)",
    "link_gbps": "link (GB/s)",
    "busbw_pct_of_link": "bus bandwidth / link",
    "strategy": "strategy",
    "nproc": "ranks",
    "step_ms_median": "step time (median)",
    "tokens_per_s": "throughput",
    "tflops_per_device": "TFLOP/s per device",
    "mfu": "MFU",
    "peak_tensor_bytes": "peak tensors",
    "peak_memory_bytes": "peak memory",
    "predicted_bytes": "planner prediction",
    "first_loss_diff_vs_none": "first loss − none",
    "params_bytes": "parameters",
    "grads_bytes": "gradients",
    "optimizer_bytes": "optimizer state",
    "activations_bytes": "activations",
    "total_bytes": "total",
    "fits": "fits",
    "max_micro_batch": "largest micro-batch",
    "variant": "variant",
    "layer": "layer",
    "fwd_ms_median": "forward (ms)",
    "bwd_ms_median": "backward (ms)",
    "total_ms_median": "total (ms)",
    "fwd_ms_p10": "forward p10",
    "fwd_ms_p90": "forward p90",
    "bwd_ms_p10": "backward p10",
    "bwd_ms_p90": "backward p90",
    "worst_ratio_to_tol": "worst error / tolerance",
    "ok": "ok",
    "batch": "batch",
    "fwd_median_s": "forward time",
    "fwd_ratio_to_aten": "forward / ATen",
    "bwd_median_s": "backward time",
    "bwd_ratio_to_aten": "backward / ATen",
    "params": "parameters",
    "step_seconds_median": "step time (median)",
    "speedup": "speed-up",
}


def header(key: str) -> str:
    """A column header for `key`: its name for people, never the raw JSON key."""
    if key in HEADERS:
        return HEADERS[key]
    words = key.replace("_", " ")
    for raw, unit in ((" ms", " (ms)"), (" s", " (s)"), (" pct", " (%)"), (" gbps", " (GB/s)"), (" bytes", "")):
        if words.endswith(raw):
            return words[: -len(raw)] + unit
    return words
