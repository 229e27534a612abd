"""Summaries of repeated timings: medians with spread, never a single lucky number."""

from __future__ import annotations

import statistics
from typing import Sequence


def summarize(samples: Sequence[float]) -> dict:
    """median, spread (p10/p90, min/max, IQR) and count of `samples`."""
    xs = sorted(float(s) for s in samples)
    if not xs:
        return {"n": 0, "median": None, "p10": None, "p90": None, "min": None, "max": None, "iqr": None}
    q = lambda p: xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))]  # noqa: E731 nearest-rank
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "p10": q(0.10),
        "p90": q(0.90),
        "min": xs[0],
        "max": xs[-1],
        "iqr": q(0.75) - q(0.25),
    }


def format_spread(s: dict, scale: float = 1.0, unit: str = "") -> str:
    """'12.3 ms [11.9–13.0]' — median with p10–p90."""
    if not s or s.get("median") is None:
        return "n/a"
    return f"{s['median'] * scale:.3g}{unit} [{s['p10'] * scale:.3g}–{s['p90'] * scale:.3g}]"
