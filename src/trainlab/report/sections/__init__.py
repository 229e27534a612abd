"""One module per family of results (`results.kinds.KINDS`): `render(result, ctx) -> blocks`, chosen
by the kind the file names. Each reads every fact it states from the result and its plan."""

from __future__ import annotations

from trainlab.report.blocks import Block
from trainlab.report.inputs import ResultFile
from trainlab.report.sections import dp, gpt, lenet, ops, table
from trainlab.report.sections.common import Ctx
from trainlab.results.kinds import KINDS

FAMILIES = {"lenet": lenet, "ops": ops, "dp": dp, "gpt": gpt, "table": table}


def result_section(res: ResultFile, ctx: Ctx) -> list[Block]:
    """The result's heading (its kind's title) and what its family's module renders."""
    kind = KINDS[res.kind]
    return [Block("h2", kind.title)] + FAMILIES[kind.family].render(res, ctx)
