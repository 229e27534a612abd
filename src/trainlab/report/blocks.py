"""The report's building blocks: one `Block` per heading, paragraph, table, figure or fold, and the
small constructors for a paragraph's pieces. Every section module (build, lab, ablation) makes these;
`build` renders them, to HTML through the autoescaping template and to escaped Markdown."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Block:
    kind: str  # h1..h4 | p | table | img | pre | note | status | details | toc | fold | row | student
    text: str = ""
    rows: list[list[str]] | None = None  # table: first row is the header
    src: str = ""  # img: path relative to the report directory
    body: str = ""  # details: preformatted text shown when the block is opened
    segments: list[tuple[str, str, str]] = field(default_factory=list)  # p: (text|code|link, text, anchor)
    anchor: str = ""  # headings: the id a link or the table of contents points at
    links: list[tuple[str, str]] = field(default_factory=list)  # toc: (text, anchor)
    children: list[Block] = field(default_factory=list)  # fold: shown when opened (<details>); row: side by side
    text_table: bool = False  # table: a table of words (left-aligned), not of numbers


def para(*parts) -> Block:
    """A paragraph of plain text, `code(...)` and `link(...)` pieces: every piece is data, escaped by
    the template; no piece is ever markup."""
    return Block("p", segments=[p if isinstance(p, tuple) else ("text", str(p), "") for p in parts])


def code(text) -> tuple[str, str, str]:
    return ("code", str(text), "")


def link(text, anchor: str) -> tuple[str, str, str]:
    return ("link", str(text), anchor)


def fold(summary: str, children: list[Block]) -> Block:
    """Blocks folded away under a one-line summary (<details>): detail tables stay on the page
    without making it long."""
    return Block("fold", summary, children=children)


def student(title: str, ask: str = "") -> Block:
    """A marked place for the student's own text (a procedure account, a discussion, an answer to one of
    the handout's 思考 questions): shown empty, never filled by trainlab."""
    return Block("student", title, body=ask)
