"""Plain-text tables and paragraphs that fit a terminal width without cutting any value.

Explain and explain analyze print tables whose cells (covered ops, tilings) can be long.
Cells that do not fit their column wrap onto continuation lines of the same row (at spaces,
commas and ``+``), never truncated: a reader sees every value. Columns shrink widest-first
until the row fits ``width``; numeric columns (``right``) keep their natural width.
"""
from __future__ import annotations

import re
import textwrap

WIDTH = 120
MIN_COLUMN = 8
_BREAK = re.compile(r"(?<=[ ,+])")


def _wrap_cell(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    lines, line = [], ""
    for piece in _BREAK.split(text):
        while len(piece) > width:                   # an unbreakable run: split it, marked by the next line
            if line:
                lines.append(line.rstrip())
                line = ""
            lines.append(piece[:width])
            piece = piece[width:]
        if len(line) + len(piece.rstrip()) > width and line:
            lines.append(line.rstrip())
            line = ""
        line += piece
    if line.strip():
        lines.append(line.rstrip())
    return lines or [""]


def table(header, rows, *, right=(), shrink_first=(), width: int = WIDTH, gap: int = 2) -> list[str]:
    """``header`` and ``rows`` (tuples of strings) as aligned lines no wider than ``width``
    (where the fixed columns allow); a row whose cells wrap takes several lines. Columns in
    ``shrink_first`` wrap before the others."""
    head, blocks = table_blocks(header, rows, right=right, shrink_first=shrink_first, width=width, gap=gap)
    return head + [line for block in blocks for line in block]


def table_blocks(header, rows, *, right=(), shrink_first=(), width: int = WIDTH, gap: int = 2):
    """As :func:`table`, split: (header lines, one list of lines per row)."""
    n = len(header)
    right = set(right)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(n)]
    floor = [max(MIN_COLUMN, len(h)) for h in header]
    for group in ([i for i in shrink_first if i not in right], [i for i in range(n) if i not in right]):
        while sum(widths) + gap * (n - 1) > width:
            i = max(group, key=lambda j: widths[j] - floor[j], default=None)
            if i is None or widths[i] <= floor[i]:
                break
            widths[i] -= 1

    def emit(cells) -> list[str]:
        wrapped = [_wrap_cell(str(c), widths[i]) for i, c in enumerate(cells)]
        out = []
        for k in range(max(len(w) for w in wrapped)):
            parts = []
            for i, w in enumerate(wrapped):
                c = w[k] if k < len(w) else ""
                parts.append(c.rjust(widths[i]) if i in right else c.ljust(widths[i]))
            out.append((" " * gap).join(parts).rstrip())
        return out

    head = emit(header) + [(" " * gap).join("-" * w for w in widths)]
    return head, [emit(r) for r in rows]


def paragraph(text: str, *, width: int = WIDTH, indent: str = "", subsequent: str | None = None) -> list[str]:
    """``text`` wrapped at ``width`` (words never split unless longer than a line)."""
    return textwrap.wrap(text, width=width, initial_indent=indent,
                         subsequent_indent=indent + "  " if subsequent is None else subsequent,
                         break_on_hyphens=False) or [indent.rstrip()]


def human_bytes(n: float) -> str:
    """``1.28 MB`` (decimal units, 3 significant digits), ``512 B``."""
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= k:
            return f"{n / k:.3g} {unit}"
    return f"{int(round(n))} B"
