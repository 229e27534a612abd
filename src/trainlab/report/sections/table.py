"""A benchmark script's table (kind `benchmark`): its rows' scalar columns, as the script wrote them."""

from __future__ import annotations

from trainlab.report.blocks import Block
from trainlab.report.inputs import ResultFile
from trainlab.report.sections.common import Ctx, record_blocks, table_from_rows


def scalar_table(rows: list[dict], preferred: list[str] | None = None) -> list[list[str]]:
    """A table of the rows' scalar columns (nested dicts and lists stay in the raw file)."""
    keys: list[str] = []
    for r in rows:
        keys += [k for k, v in r.items() if k not in keys and (v is None or isinstance(v, (str, int, float, bool)))]
    if preferred:
        keys = [k for k in preferred if k in keys] or keys
    return table_from_rows(rows, keys)


def render(res: ResultFile, ctx: Ctx) -> list[Block]:
    rows = [r for r in res.rows if isinstance(r, dict)]
    return record_blocks(res.path, res.data, ctx) + ([Block("table", rows=scalar_table(rows))] if rows else [])
