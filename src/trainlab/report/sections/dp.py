"""Data parallel on LeNet-5: the modes compared, the DataLoader workers study, and the compiled and
CUDA-graph steps (benchmarks/dp_compile.py)."""

from __future__ import annotations

from trainlab.report import format as fmt
from trainlab.report import plots
from trainlab.report.blocks import Block, para
from trainlab.report.inputs import ResultFile
from trainlab.report.sections.common import Ctx, record_blocks, table_from_rows
from trainlab.telemetry.results import DP_COMPARE_COLUMNS

BUS_COLUMNS = [
    "mode",
    "world_size",
    "grad_bytes",
    "bytes_sent_per_step",
    "allreduce_ms",
    "bound_comm_ms",
    "algbw_gbps",
    "busbw_gbps",
    "link_gbps",
    "busbw_pct_of_link",
]
COMPILE_NOTE = (
    "Step time: each step synchronized on its own (median). Queued / finished: the same steps run "
    "back to back, timed without and with a final synchronize — what the host queued against what the "
    "GPU finished. Throughput = batch / finished ms per step, the rate of training's back-to-back steps."
)


def compile_table(rows: list[dict]) -> list[list[str]]:
    """benchmarks/dp_compile.py's rows. The throughput is computed from the column beside it (batch /
    synced ms per step): the file's own images_per_s was batch / the median of singly synchronized
    steps before that script was fixed, which matches neither timing column shown."""
    table = [
        [
            "variant",
            "batch",
            "compile / capture",
            "step time (median, each synchronized)",
            "queued ms/step (no sync)",
            "finished ms/step (synced)",
            "throughput (batch / finished)",
        ]
    ]
    for r in rows:
        step = r.get("step_ms") if isinstance(r.get("step_ms"), dict) else {}
        batch, synced = r.get("batch_size"), r.get("synced_ms_per_step")
        tput = batch / (synced / 1e3) if fmt.is_number(batch) and fmt.is_number(synced) and synced > 0 else None
        table.append(
            [
                str(r.get("variant")),
                fmt.value("batch", batch),
                fmt.value("setup_seconds", r.get("setup_seconds")),
                fmt.millis(step.get("median")),
                fmt.millis(r.get("unsynced_ms_per_step")),
                fmt.millis(synced),
                fmt.rate(tput),
            ]
        )
    return table


def _compare(res: ResultFile, ctx: Ctx) -> list[Block]:
    rows = res.rows
    blocks = [Block("table", rows=table_from_rows(rows, list(DP_COMPARE_COLUMNS)))]
    bus = [r for r in rows if r.get("busbw_gbps") is not None]
    if bus:
        blocks.append(
            para("Gradient all-reduce against the 2(W−1)/W·S/B bound (S gradient bytes, B measured link bandwidth):")
        )
        blocks.append(Block("table", rows=table_from_rows(bus, BUS_COLUMNS)))
    labels = [
        f"{r.get('mode')}×{r.get('world_size')}" + (f" w{r['workers']}" if r.get("workers") is not None else "")
        for r in rows
    ]
    values = [float(r.get("images_per_s") or 0) for r in rows]
    png = ctx.figure(
        f"result{ctx.index}_dp.png",
        res.path,
        lambda path: plots.bars(labels, values, path, "Throughput by mode", "images/s"),
    )
    return blocks + [Block("img", "Throughput by mode", src=png.name)]


def render(res: ResultFile, ctx: Ctx) -> list[Block]:
    blocks = record_blocks(res.path, res.data, ctx)
    if res.kind == "dp_compile":
        return blocks + [Block("table", rows=compile_table(res.rows)), para(COMPILE_NOTE)]
    return blocks + _compare(res, ctx)
