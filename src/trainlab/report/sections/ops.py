"""The operators' results, GELU's included: correctness against the reference, and speed against
ATen — with a timing that cannot be right flagged, not reported."""

from __future__ import annotations

from trainlab.report import format as fmt
from trainlab.report.blocks import Block, para
from trainlab.report.inputs import ResultFile
from trainlab.report.sections.common import Ctx, record_blocks, table_from_rows

# What the |Δloss| and gradient MSE columns of `gelu check` measure (ops/check.py, _gelu_recipe)
GELU_RECIPE_NOTE = (
    "|Δloss| and gradient MSE: the handout's check (§4.2.1). A = torch.randn(100) and a target "
    "c = torch.randn(100) go through F.gelu and through this implementation in the row's dtype; "
    "|Δloss| is the difference of the two MSE losses against c, gradient MSE the mean squared "
    "difference of the two input gradients."
)
# An elementwise rung reads and writes what F.gelu does: more than this many times faster means the
# baseline's own timing stalled (a 2-thread OpenMP pool on 1K elements: 15.9 ms, against 0.012 ms on one)
MAX_PLAUSIBLE_SPEEDUP = 10.0

CHECK_COLUMNS = [
    "case",
    "impl",
    "approximate",
    "dtype",
    "fwd_max_abs_err",
    "grad_max_abs_err",
    "recipe_loss_diff",
    "recipe_grad_mse",
    "gradcheck",
    "gradgradcheck",
    "status",
]
BENCH_COLUMNS = [
    "size",
    "impl",
    "pass",
    "dtype",
    "approximate",
    "median_s",
    "p10_s",
    "p90_s",
    "gbps",
    "ratio_to_torch",
    "pct_of_copy_bw",
]


def implausible(rows: list[dict]) -> dict[int, str]:
    """Row index → why its timing cannot be right: F.gelu slower on n elements than on more (time
    cannot fall as the work grows), or a rung over MAX_PLAUSIBLE_SPEEDUP× faster than F.gelu."""
    aten = {
        (r.get("pass"), r.get("dtype"), r["size"]): r["median_s"]
        for r in rows
        if r.get("impl") == "aten" and fmt.is_number(r.get("size")) and fmt.is_number(r.get("median_s"))
    }
    flags = {}
    for i, r in enumerate(rows):
        key = (r.get("pass"), r.get("dtype"), r.get("size"))
        base = aten.get(key)
        larger = [t for (p, d, n), t in aten.items() if (p, d) == key[:2] and fmt.is_number(key[2]) and n > key[2]]
        if base is not None and larger and base > min(larger):
            flags[i] = f"F.gelu took longer on {fmt.count(key[2])} elements than on more: its timing stalled"
        elif fmt.is_number(r.get("ratio_to_torch")) and 0 < r["ratio_to_torch"] < 1 / MAX_PLAUSIBLE_SPEEDUP:
            flags[i] = f"over {MAX_PLAUSIBLE_SPEEDUP:.0f}× faster than F.gelu: F.gelu's timing stalled"
    return flags


def bench_rows(res: ResultFile) -> tuple[list[dict], list[str]]:
    """gelu_bench's rows with an implausible ratio replaced by the word 'flagged', and the reasons."""
    flags = implausible(res.rows)
    rows = [{**r, "ratio_to_torch": "flagged"} if i in flags else r for i, r in enumerate(res.rows)]
    reasons = sorted({f"{fmt.count(res.rows[i].get('size'))} elements: {why}" for i, why in flags.items()})
    return rows, reasons


def check_rows(rows: list[dict]) -> list[dict]:
    """A row that could not run here (no GPU, no Triton) is "skipped", never "ok"; a case's own checks
    (the handout's recipe) come up from "checks"."""
    return [
        {
            **r,
            **(r.get("checks") if isinstance(r.get("checks"), dict) else {}),
            "status": "skipped: " + str(r.get("reason"))
            if r.get("skipped")
            else r.get("status") or ("ok" if r.get("ok") else "FAIL"),
        }
        for r in rows
    ]


def _gelu_check(res: ResultFile) -> list[Block]:
    rows = check_rows(res.rows)
    failed = [r for r in rows if r["status"] == "FAIL"]
    skipped = [r for r in rows if r["status"].startswith("skipped")]
    blocks = [
        para(
            f"{len(rows)} rows: {len(rows) - len(failed) - len(skipped)} ok, {len(failed)} failing, "
            f"{len(skipped)} skipped (could not run on the machine that made the file)."
        ),
        Block("table", rows=table_from_rows(rows, CHECK_COLUMNS)),
    ]
    if any("recipe_loss_diff" in r for r in rows):
        blocks.append(para(GELU_RECIPE_NOTE))
    return blocks


def _gelu_bench(res: ResultFile) -> list[Block]:
    rows, reasons = bench_rows(res)
    blocks = [Block("table", rows=table_from_rows(rows, BENCH_COLUMNS))]
    if reasons:
        blocks.append(Block("note", "Flagged, not reported: " + "; ".join(reasons) + "."))
    return blocks


def _ops_check(res: ResultFile) -> list[Block]:
    failed = [r for r in res.rows if r.get("ok") is False]
    cols = ["op", "case", "impl", "dtype", "fwd_max_abs_err", "grad_max_abs_err", "worst_ratio_to_tol", "ok"]
    return [para(f"{len(res.rows)} rows, {len(failed)} failing."), Block("table", rows=table_from_rows(res.rows, cols))]


def _ops_bench(res: ResultFile) -> list[Block]:
    cols = ["batch", "layer", "impl", "fwd_median_s", "fwd_ratio_to_aten", "bwd_median_s", "bwd_ratio_to_aten"]
    return [Block("table", rows=table_from_rows(res.rows, cols))]


KINDS = {"gelu_check": _gelu_check, "gelu_bench": _gelu_bench, "ops_check": _ops_check, "ops_bench": _ops_bench}


def render(res: ResultFile, ctx: Ctx) -> list[Block]:
    return record_blocks(res.path, res.data, ctx) + KINDS[res.kind](res)
