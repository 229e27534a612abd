"""Markdown escaping: every value reaching report.md is text, as every value reaching index.html is.

The HTML page is escaped by its autoescaping template; report.md is built by `build.to_markdown` from
the same blocks, and every piece of text goes through one of these by construction: `text` (headings,
paragraphs, notes, table cells), `code` (an inline code span) and `fence` (a preformatted block). A
step title such as `<img src=x onerror=alert(1)>` or `[click](javascript:…)` is shown as those
characters, never as HTML or a link, in any Markdown viewer (CommonMark, GitHub).
"""

from __future__ import annotations

import html
import re

from trainlab.text import shown

# CommonMark's backslash-escapable punctuation that can start markup inline: emphasis, code, links,
# images, raw HTML, entities, table cells, strikethrough. `_` only where it can open or close emphasis
# (not between two letters or digits), so names such as lenet_train stay readable in the raw file.
_INLINE = re.compile(r"[\\`*\[\]<>&|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# what makes a line a block (heading, list, quote, rule, ordered list) when it starts one
_LINE_START = re.compile(r"^(\s*)([#+\-=>]|\d+[.)])")


def text(value, line_start: bool = False) -> str:
    """`value` as literal Markdown text on one line; `line_start`: it begins a line of its own (a
    paragraph, a quote, a list item), where `# `, `- ` or `1. ` would make it a heading or a list."""
    raw = shown(value)  # the text gate: control characters and lone surrogates as escapes
    one_line = _INLINE.sub(lambda m: "\\" + m.group(0), " ".join(raw.split()))
    # a piece beside an inline code span keeps the space at its edge: "by `trainlab train` on", not "by`…`on"
    trail = " " if raw[-1:].isspace() and one_line else ""
    if not line_start:
        return (" " if raw[:1].isspace() and one_line else "") + one_line + trail
    one_line += trail
    return _LINE_START.sub(
        lambda m: (
            m.group(1) + "\\" + m.group(2)
            if not m.group(2)[0].isdigit()
            else m.group(1) + m.group(2)[:-1] + "\\" + m.group(2)[-1]
        ),
        one_line,
    )


def code(value) -> str:
    """`value` as an inline code span: fenced by more backticks than it holds in a row."""
    one_line = " ".join(shown(value).split())
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", one_line)), default=0) + 1)
    pad = " " if one_line.startswith("`") or one_line.endswith("`") or not one_line else ""
    return f"{ticks}{pad}{one_line}{pad}{ticks}"


def fence(value) -> list[str]:
    """`value` as a fenced code block (its lines verbatim): a fence longer than any backtick run in it."""
    body = str(value).rstrip()
    ticks = "`" * max(3, max((len(run) for run in re.findall(r"`+", body)), default=0) + 1)
    return [ticks, body, ticks]


def html_text(value) -> str:
    """Text inside the raw HTML that Markdown passes through (<details><summary>…): HTML-escaped, and the
    brackets as entities too, for viewers that read Markdown links inside a summary."""
    return html.escape(" ".join(str(value).split())).replace("[", "&#91;").replace("]", "&#93;")


def link_target(value) -> str:
    """A relative file name as a link or image target: nothing in it can end the target early."""
    return re.sub(
        r"[^A-Za-z0-9._/-]", lambda m: f"%{ord(m.group(0)):02X}" if ord(m.group(0)) < 128 else m.group(0), str(value)
    )
