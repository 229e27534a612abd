"""The one fallback for result files written before every record carried `{"kind", "schema", "plan"}`
(`results.kinds`): their kind recognised from the keys their producer guaranteed then, and a line
saying what they lack. New files never come here: they name their kind."""

from __future__ import annotations

from typing import Any

# (kind, keys every row (or the object) had): first match wins, in this order
_OBJECT_KEYS = (
    ("lenet_train", {"test_accuracy"}),
    ("gpt_bench", {"strategy", "tokens_per_s", "world_size"}),
    ("gpt_ablation", {"total_tokens", "rows"}),
)
_ROW_KEYS = (
    ("lenet_profile", {"variant", "layer", "fwd_ms_median"}),
    ("ops_check", {"op", "case", "impl", "worst_ratio_to_tol"}),
    ("ops_bench", {"layer", "impl", "fwd_median_s"}),
    ("gelu_check", {"impl", "fwd_max_abs_err"}),
    ("gelu_bench", {"impl", "size", "median_s"}),
    ("dp_compile", {"variant", "unsynced_ms_per_step", "synced_ms_per_step"}),
    ("dp_compare", {"mode", "world_size", "epoch_seconds"}),
    ("gpt_compare", {"strategy", "status"}),
)


def rows_of(data: Any) -> list:
    if isinstance(data, list):
        return data
    for key in ("rows", "strategies"):
        if isinstance(data, dict) and isinstance(data.get(key), list):
            return data[key]
    return [data] if isinstance(data, dict) else []


def legacy_kind(data: Any) -> str | None:
    """The kind of an unstamped file, from its keys; None: not a trainlab result."""
    if isinstance(data, dict):
        if "params" in data and isinstance(data.get("strategies"), list):
            return "gpt_plan"
        for kind, keys in _OBJECT_KEYS:
            if keys <= set(data) and (kind != "gpt_ablation" or isinstance(data.get("rows"), list)):
                return kind
    rows = rows_of(data)
    first = rows[0] if rows and isinstance(rows[0], dict) else {}
    for kind, keys in _ROW_KEYS:
        if keys <= set(first):
            if kind == "ops_check" and all(isinstance(r, dict) and r.get("op") == "gelu" for r in rows):
                return "gelu_check"  # every operator's rows have the same shape; GELU's alone are its check
            return kind
    return None


def lacks(name: str) -> str:
    """The line a legacy file's section carries."""
    return (
        f"{name} was written before trainlab recorded each result's kind and plan: its kind is read from its "
        "keys, and facts it does not hold (dataset sizes, model shape, device, precision, threads) are not stated."
    )
