"""Plain-text tables and paragraphs that fit the reader's screen without cutting any value.

The width is the terminal's (``COLUMNS`` honoured), else 100 columns in a pipe or a log
(:func:`terminal_width`). A cell that does not fit its column wraps onto continuation lines
of its row, at spaces, commas, ``+``, ``/`` (and after ``_``, ``=``, ``.`` inside an identifier
that is wider than its column) — never inside a word: a column
is never narrower than its longest unbreakable piece. When the columns still do not fit,
the optional columns a caller names are left out (lowest priority first) and the table says
which (``--json`` carries them); numeric columns (``right``) keep their natural width.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap

PIPE_WIDTH = 100        # a pipe, a log, CI: no terminal to ask
MIN_WIDTH = 40
WIDTH = PIPE_WIDTH      # the default of the functions below when no width is given
MIN_COLUMN = 4
_SOFT = re.compile(r"(?<=[ ,+/])")     # between words
_HARD = re.compile(r"(?<=[_=.])(?=[^_=.])")   # inside an identifier, only where a word is wider than its column


_UNIT = re.compile(r"(?<=\d) (?=(?:B|kB|MB|GB|KiB|MiB|GiB|TiB|ns|us|ms|s|GB/s|TFLOPS|TOPS)\b)")
_NBSP = "\u00a0"


def _glue(text: str) -> str:
    """A number and its unit never part at a line break (``48.85 MiB`` stays whole)."""
    return _UNIT.sub(_NBSP, text)


def terminal_width(stream=None) -> int:
    """``COLUMNS`` if set (at least 40), else the terminal's width when ``stream`` (stdout by
    default) is one, else :data:`PIPE_WIDTH`."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) >= MIN_WIDTH:
        return int(env)
    stream = sys.stdout if stream is None else stream
    try:
        if stream.isatty():
            return max(MIN_WIDTH, shutil.get_terminal_size((PIPE_WIDTH, 24)).columns)
    except (AttributeError, ValueError, OSError):
        pass
    return PIPE_WIDTH


def pieces(text: str, width: int | None = None) -> list[str]:
    """``text`` cut after each space, comma, ``+`` or ``/``; a word still wider than
    ``width`` is cut after its underscores too."""
    out = []
    for word in (p.replace(_NBSP, " ") for p in _SOFT.split(_glue(text)) if p):
        if width is not None and len(word.rstrip()) > width:
            out += [p for p in _HARD.split(word) if p]
        else:
            out.append(word)
    return out


def _longest_piece(text: str, hard: bool) -> int:
    return max((len(p.rstrip()) for p in pieces(text, 0 if hard else None)), default=0)


def _wrap_cell(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    lines, line = [], ""
    for piece in pieces(text, width):
        if line and len(line) + len(piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = piece.lstrip()
        else:
            line += piece
    if line.strip():
        lines.append(line.rstrip())
    return lines or [""]


def table(header, rows, *, right=(), shrink_first=(), optional=(), width: int | None = None,
          gap: int = 2) -> list[str]:
    """``header`` and ``rows`` (tuples of strings) as aligned lines no wider than ``width``
    (default :func:`terminal_width`); a row whose cells wrap takes several lines. Columns in
    ``shrink_first`` wrap before the others; ``optional`` (column indices, the first left out
    first) may be left out when nothing else fits, with a line saying so."""
    head, blocks, dropped = fit_blocks(header, rows, right=right, shrink_first=shrink_first, optional=optional,
                                       width=width, gap=gap)
    return head + [line for block in blocks for line in block] + dropped_note(dropped, width)


def dropped_note(dropped, width: int | None = None) -> list[str]:
    if not dropped:
        return []
    return paragraph(f"(left out to fit {width or terminal_width()} columns: {', '.join(dropped)}; --json has "
                     "them, or set COLUMNS wider)", width=width)


def table_blocks(header, rows, *, right=(), shrink_first=(), width: int | None = None, gap: int = 2):
    """As :func:`table`, split: (header lines, one list of lines per row); no column left out."""
    head, blocks, _ = fit_blocks(header, rows, right=right, shrink_first=shrink_first, width=width, gap=gap)
    return head, blocks


def fit_blocks(header, rows, *, right=(), shrink_first=(), optional=(), width: int | None = None, gap: int = 2):
    """(header lines, lines per row, names of the columns left out)."""
    width = terminal_width() if width is None else width
    # headers wrap first, then optional columns go, then cells wrap at spaces, then identifiers
    fits = False
    for level in (0, 1):
        keep, dropped = list(range(len(header))), []
        for drop in (None, *optional):
            if drop is not None:
                keep.remove(drop)
                dropped.append(str(header[drop]))
            widths = _fit([header[i] for i in keep], [[r[i] for i in keep] for r in rows],
                          {keep.index(i) for i in right if i in keep},
                          [keep.index(i) for i in shrink_first if i in keep], width, gap, level)
            fits = sum(widths) + gap * (len(keep) - 1) <= width
            if fits:
                break
        if fits:
            break
    if not fits:
        widths = _fit([header[i] for i in keep], [[r[i] for i in keep] for r in rows],
                      {keep.index(i) for i in right if i in keep},
                      [keep.index(i) for i in shrink_first if i in keep], width, gap, 2)
    rmap = {keep.index(i) for i in right if i in keep}

    def emit(cells) -> list[str]:
        wrapped = [_wrap_cell(str(c), widths[i]) for i, c in enumerate(cells)]
        out = []
        for k in range(max(len(w) for w in wrapped)):
            parts = []
            for i, w in enumerate(wrapped):
                c = w[k] if k < len(w) else ""
                parts.append(c.rjust(widths[i]) if i in rmap else c.ljust(widths[i]))
            out.append((" " * gap).join(parts).rstrip())
        return out

    head = emit([header[i] for i in keep]) + [(" " * gap).join("-" * w for w in widths)]
    return head, [emit([r[i] for i in keep]) for r in rows], dropped


def _fit(header, rows, right, shrink_first, width, gap, level) -> list[int]:
    """Column widths: level 0 wraps only headers (at spaces), 1 also text cells at spaces,
    2 also identifiers after their underscores; numbers (``right``) never wrap."""
    n = len(header)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(n)]
    hard = level >= 2
    floor = [max(MIN_COLUMN, _longest_piece(str(header[i]), hard),
                 *((len(str(r[i])) if (i in right or level == 0) else _longest_piece(str(r[i]), hard))
                   for r in rows)) for i in range(n)]
    _shrink(widths, floor, ([i for i in shrink_first if i not in right], [i for i in range(n) if i not in right],
                            sorted(right)), width - gap * (n - 1))
    return widths


def _shrink(widths, floor, groups, room) -> None:
    for group in groups:
        while sum(widths) > room:
            i = max(group, key=lambda j: widths[j] - floor[j], default=None)
            if i is None or widths[i] <= floor[i]:
                break
            widths[i] -= 1


def paragraph(text: str, *, width: int | None = None, indent: str = "", subsequent: str | None = None) -> list[str]:
    """``text`` wrapped at ``width`` (default :func:`terminal_width`); words are never split
    (a word longer than a line, such as a path or a hash, stands alone on its line)."""
    lines = textwrap.wrap(_glue(text), width=terminal_width() if width is None else width, initial_indent=indent,
                          subsequent_indent=indent + "  " if subsequent is None else subsequent,
                          break_on_hyphens=False, break_long_words=False) or [indent.rstrip()]
    return [line.replace(_NBSP, " ") for line in lines]


def human_time(s: float) -> str:
    """``2.36 ms``, ``553 us``, ``8.39 ns`` (3 significant digits): every time a user reads."""
    if s == float("inf"):
        return "inf"
    for unit, k in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= k:
            return f"{s / k:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"

