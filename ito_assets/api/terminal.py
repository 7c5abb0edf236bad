"""Text bound for a terminal or a log line, with every control character made visible.

Run logs, audit details, corpus excerpts and server messages are text from elsewhere: printed raw,
an ESC sequence could clear the screen or recolour what follows, a carriage return could overwrite
a line, and a newline, NUL or Unicode line separator could forge one. Each such character becomes
a visible escape instead: C0 (U+0000-U+001F, newline and tab included), DEL, C1 (U+0080-U+009F)
as \\xNN, the line and paragraph separators U+2028/U+2029 and the bidirectional embeddings,
overrides and isolates (U+202A-U+202E, U+2066-U+2069: text shown in another order than it reads,
the "Trojan Source" characters of CVE-2021-42574) as \\uNNNN. Backslashes stay as they are, so
escaping twice changes nothing.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """`text` with each control character replaced by its visible escape."""
    return _CONTROL.sub(_visible, text)


def table(rows: list[dict], columns: list[str]) -> list[str]:
    """`rows` as an aligned plain-text table under a header of the column names, indented two
    spaces; cells escaped before they are measured, so the columns line up as printed."""
    if not rows:
        return ["  (none)"]
    cells = [[("" if r.get(c) is None else escape(str(r.get(c)))) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return ("  " + "  ".join(v.ljust(w) for v, w in zip(values, widths))).rstrip()

    return [line(columns), line(["-" * w for w in widths]), *(line(row) for row in cells)]
