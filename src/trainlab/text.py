"""The one text gate: a string from a file, a file name or the environment is shown through `shown`.

Such a string is not clean text. A folder name can hold an escape sequence (`ESC]0;…BEL` retitles the
terminal, `ESC[2J` clears it) or a byte that is not UTF-8 (Python hands it over as a lone surrogate,
`\\udc80`, which cannot be encoded: writing it into index.html or a figure raised UnicodeEncodeError); a
JSON field or a lock file's command line can hold a newline that forges a second message line. `shown`
keeps every printable character and writes the others as Python escapes (`\\x1b`, `\\n`, `\\udc80`,
`\\u202e`), so the value reads as what it is, stays on one line, and encodes anywhere.

Where it applies: every `UserError` message (`trainlab.errors`), the notes and warnings trainlab prints
about folders and files, a lock holder's command, and the report's one formatting point for values that
reach HTML, Markdown or a figure. The JSON reader (`schema.loads`) goes further and refuses lone
surrogates: trainlab never writes them, so such a file was edited or crafted.
"""

from __future__ import annotations

import re

# C0/C1 controls and DEL; lone surrogates; the bidirectional overrides and isolates, which reorder what a
# terminal shows (a name can display as another); the line and paragraph separators.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069\u2028\u2029]")


_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return _NAMED.get(m.group()) or (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}")


_UNSAFE_IN_BLOCK = re.compile(_UNSAFE.pattern.replace("\x00-\x1f", "\x00-\x08\x0b-\x1f"))  # keeps \t and \n


def shown(value: object, lines: bool = False) -> str:
    """`value` as text that is safe to print, render or draw: unsafe characters written as escapes.
    `lines`: a block of text (a log excerpt, a page's stylesheet) keeps its tabs and line breaks."""
    text = value if isinstance(value, str) else str(value)
    return (_UNSAFE_IN_BLOCK if lines else _UNSAFE).sub(_escape, text)


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in `text` (not encodable as UTF-8), or None."""
    m = re.search("[\ud800-\udfff]", text)
    return m.start() if m else None
