"""GPT-2's results: one benchmark, the memory plan, the strategy comparison and the ablation."""

from __future__ import annotations

from trainlab.report import format as fmt
from trainlab.report import plots
from trainlab.report.ablation import ablation_blocks
from trainlab.report.blocks import Block, para
from trainlab.report.inputs import ResultFile
from trainlab.report.sections.common import Ctx, record_blocks, table_from_rows

BENCH_KEYS = (
    "strategy",
    "world_size",
    "params",
    "step_seconds_median",
    "tokens_per_s",
    "tflops_per_device",
    "mfu",
    "peak_memory_bytes",
)
PLAN_COLUMNS = [
    "strategy",
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "activations_bytes",
    "total_bytes",
    "fits",
    "max_micro_batch",
]
COMPARE_COLUMNS = [
    "strategy",
    "nproc",
    "status",
    "step_ms_median",
    "tokens_per_s",
    "speedup",
    "tflops_per_device",
    "mfu",
    "peak_tensor_bytes",
    "predicted_bytes",
    "first_loss_diff_vs_none",
]


def _bench(res: ResultFile, ctx: Ctx) -> list[Block]:
    d = res.data
    rows = [["metric", "value"]] + [[fmt.header(k), fmt.value(k, d[k])] for k in BENCH_KEYS if k in d]
    blocks = [Block("table", rows=rows)]
    if d.get("losses"):
        blocks.append(para("losses: " + ", ".join(fmt.number(x) for x in d["losses"])))
    floor = d.get("loss_floor_uniform_tokens")
    if fmt.is_number(floor):  # the tokens are uniform random: no model's loss goes below ln V (report 000)
        blocks.append(para(f"loss floor for uniform random tokens: ln V = {fmt.number(floor)} (recorded by the run)"))
    return blocks


def _plan(res: ResultFile, ctx: Ctx) -> list[Block]:
    return [
        para(f"model params: {fmt.count(res.data.get('params'))}"),
        Block("table", rows=table_from_rows(res.rows, PLAN_COLUMNS)),
    ]


def _compare(res: ResultFile, ctx: Ctx) -> list[Block]:
    # speed-up: throughput over `none` (else the first row), as the handout's table wants
    rows = res.rows
    ref_row = next((r for r in rows if r.get("strategy") == "none"), rows[0] if rows else {})
    ref = ref_row.get("tokens_per_s")
    rows = [
        {
            **r,
            "speedup": f"{r['tokens_per_s'] / ref:.2f}× vs {ref_row.get('strategy')}"
            if fmt.is_number(ref) and ref > 0 and fmt.is_number(r.get("tokens_per_s"))
            else None,
        }
        for r in rows
    ]
    blocks = [Block("table", rows=table_from_rows(rows, COMPARE_COLUMNS))]
    ok = [r for r in rows if r.get("tokens_per_s")]
    if not ok:
        return blocks
    png = ctx.figure(
        f"result{ctx.index}_gpt_tps.png",
        res.path,
        lambda path: plots.bars(
            [r["strategy"] for r in ok],
            [r["tokens_per_s"] for r in ok],
            path,
            "GPT throughput per strategy",
            "tokens/s",
        ),
    )
    blocks.append(Block("img", "Throughput per strategy", src=png.name))
    key = "peak_tensor_bytes" if any(r.get("peak_tensor_bytes") for r in ok) else "peak_memory_bytes"
    mem = [r for r in ok if r.get(key)]
    if mem:
        png = ctx.figure(
            f"result{ctx.index}_gpt_mem.png",
            res.path,
            lambda path: plots.bars(
                [r["strategy"] for r in mem],
                [r[key] / 2**30 for r in mem],
                path,
                f"Peak memory per strategy ({fmt.header(key)}, GiB)",
                "GiB",
            ),
        )
        blocks.append(Block("img", "Peak memory per strategy", src=png.name))
    return blocks


KINDS = {
    "gpt_bench": _bench,
    "gpt_plan": _plan,
    "gpt_compare": _compare,
    "gpt_ablation": lambda res, ctx: ablation_blocks(res.data),
}


def render(res: ResultFile, ctx: Ctx) -> list[Block]:
    return record_blocks(res.path, res.data, ctx) + KINDS[res.kind](res, ctx)
