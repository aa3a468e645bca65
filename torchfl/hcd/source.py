"""The one YAML loader of torchfl: safe, bounded, and keeping every value's source position.

PyYAML's composer gives a node tree whose nodes carry line and column marks. We compose
with ``SafeLoader`` (no tags that build objects), bound the document and build plain
Python values ourselves, so that duplicate keys are errors and every path maps to a
position. Each bound is checked before the work it protects, and its message names the
limit and what the file has:

- only regular files are opened (a FIFO, a device or a directory is refused at once, from
  ``fstat``), and their size is taken from ``fstat`` too (a sparse 50 GB file is 50 GB);
- bytes, then line length (one long flow list would otherwise cost libyaml seconds);
- from the event stream, before composing: nesting depth, aliases and number of values;
- while building: the expansion of aliases, and the length of every number's text
  (Python converts a 4,301-digit integer neither way, and a huge value has no meaning in
  a descriptor: numbers are refused by their digits, never converted).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from torchfl.hcd.diagnostics import Diagnostic, YAMLLoadError, format_path
from torchfl.hcd.yamlbuild import (MAX_NODES, Builder,  # noqa: F401 (MAX_NODES: the bounds in one place)
                                   Refused, mark_pos, prescan)

MAX_BYTES = 1 << 20  # 1 MiB: an HCD is ~2 KB, the bundled rule pack ~40 KB; anything larger is a mistake
MAX_LINE = 8192  # characters; the longest guard is 2,000

Path_ = tuple  # a path into the document: keys (str) and list indices (int)


@dataclass
class LocatedDocument:
    """Plain data (dicts, lists, scalars) plus the 1-based position of every key and value."""

    filename: str
    data: object
    value_pos: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    key_pos: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    #: path -> (position of the alias use ``*name``, name): values there come from the anchor
    aliases: dict[Path_, tuple[tuple[int, int], str]] = field(default_factory=dict)
    #: problems in single values (``located_yaml(keep_going=True)``), and the paths they dropped
    problems: list[Diagnostic] = field(default_factory=list)
    refused: set[Path_] = field(default_factory=set)

    def _alias_of(self, path: Path_):
        """The outermost alias use that ``path`` lies under: (its position, name, path), or None."""
        for n in range(len(path) + 1):
            if path[:n] in self.aliases:
                pos, name = self.aliases[path[:n]]
                return pos, name, path[:n]
        return None

    def where(self, path: Path_, *, key: bool = False) -> tuple[int, int]:
        """Position of ``path`` (its key when ``key``), else of its nearest located ancestor.

        A value reached through an alias is placed at the alias use (``count: *n``), the
        place that gave it this path; :meth:`diagnostic` adds where the anchor wrote it.
        """
        path = tuple(path)
        alias = self._alias_of(path)
        if alias and (len(path) > len(alias[2]) or not key):
            return alias[0]
        return self._where(path, key)

    def _where(self, path: Path_, key: bool) -> tuple[int, int]:
        while True:
            table = (self.key_pos, self.value_pos) if key else (self.value_pos, self.key_pos)
            for t in table:
                if path in t:
                    return t[path]
            if not path:
                return (1, 1)
            path = path[:-1]
            key = True  # a missing child is reported at its parent's key

    def diagnostic(self, path: Path_, message: str, severity: str = "error", *, key: bool = False) -> Diagnostic:
        path = tuple(path)
        line, col = self.where(path, key=key)
        alias = self._alias_of(path)
        if alias and (line, col) == alias[0]:
            at = self._where(path, key)
            message += f" (the value comes from the anchor &{alias[1]} at line {at[0]}, column {at[1]})"
        return Diagnostic(self.filename, line, col, format_path(path), severity, message)

    def is_refused(self, dotted: str) -> bool:
        """Whether a diagnostic at ``dotted`` (a formatted path) concerns a value the loader
        already refused (or lies inside one): the loader's problem is the one to show."""
        for path in self.refused:
            p = format_path(path)
            if dotted == p or dotted.startswith(p + ".") or dotted.startswith(p + "["):
                return True
        return False


# libyaml (C) when PyYAML has it: ~10x faster than the pure-Python scanner, which matters
# for the CLI's cold-start budget. Both yield the same nodes and marks.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: YAML's line breaks (\r\n, \r, \n, NEL, LS, PS): lines and columns are counted as YAML counts them
_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
_NON_PRINTABLE = yaml.reader.Reader.NON_PRINTABLE


def _line_col(text: str, index: int) -> tuple[int, int]:
    """1-based line and column (in characters) of ``text[index]``."""
    line, start = 1, 0
    for m in _BREAK.finditer(text, 0, index):
        line, start = line + 1, m.end()
    return line, index - start + 1


def _check_lines(text: str, filename: str) -> None:
    """Refuse a line longer than MAX_LINE characters, naming it and its length."""
    for number, line in enumerate(_BREAK.split(text), 1):
        if len(line) > MAX_LINE:
            raise YAMLLoadError([Diagnostic(filename, number, MAX_LINE + 1, "", "error",
                                            f"line {number} is {len(line):,} characters long; the limit is "
                                            f"{MAX_LINE:,}. Break long lists over several lines (one item per "
                                            "line) or split the guard")])


def _decode(raw: bytes, filename: str) -> str:
    def fail(offset: int, message: str):
        before = raw[:offset].decode("utf-8", "replace")  # columns count characters, not bytes
        line, col = _line_col(before, len(before))
        raise YAMLLoadError([Diagnostic(filename, line, col, "", "error", message)])

    if len(raw) > MAX_BYTES:
        fail(0, f"text is more than {_size(MAX_BYTES)} (the limit). An HCD is a few KB: is this the right file?")
    nul = raw.find(b"\x00")
    if nul >= 0:
        fail(nul, "binary data (NUL byte): expected a UTF-8 YAML text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(exc.start, f"not valid UTF-8 (byte 0x{raw[exc.start]:02x}); save the file as UTF-8")
    return text.removeprefix("\ufeff")


_KINDS = ((stat.S_ISDIR, IsADirectoryError, "a directory"), (stat.S_ISFIFO, None, "a named pipe (FIFO)"),
          (stat.S_ISCHR, None, "a character device"), (stat.S_ISBLK, None, "a block device"),
          (stat.S_ISSOCK, None, "a socket"))


class NotRegularFile(OSError):
    """The path names something other than a regular file (pipe, device, socket)."""


def read_text(path: str | Path) -> str:
    """Read a regular file as bounded UTF-8 text.

    Raises OSError if it cannot be read (:class:`NotRegularFile` for a pipe, device or
    socket, IsADirectoryError for a directory), YAMLLoadError if it is not acceptable text.
    Opening is non-blocking, so a FIFO with no writer is refused instead of waiting forever.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        for test, error, what in _KINDS:
            if test(info.st_mode):
                raise (error or NotRegularFile)(errno.EISDIR if error else errno.EINVAL,
                                                f"is {what}, not a regular file", str(path))
        if info.st_size > MAX_BYTES:
            raise YAMLLoadError([Diagnostic(str(path), 1, 1, "", "error",
                                            f"file is {_size(info.st_size)}; the limit is {_size(MAX_BYTES)}. "
                                            "An HCD is a few KB: is this the right file?")])
        raw = fh.read(MAX_BYTES + 1)  # a file growing while read is still cut at the bound
    return _decode(raw, str(path))


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n:,} bytes ({n / scale:.1f} {unit})"
    return f"{n:,} bytes"


def read_source(path: str | Path, kind: str) -> tuple[str | None, list[Diagnostic], bool]:
    """Read a user's file for checking: ``(text, [], True)``, or ``(None, diagnostics, readable)``.

    ``readable`` is False when the file cannot be opened at all (the CLI's exit 2), True
    when it was read but is not acceptable text (binary, not UTF-8, too large). ``kind``
    names what the file should be, e.g. ``"an HCD file"``. Never raises for bad input.
    """
    name = str(path)

    def unreadable(message: str):
        return None, [Diagnostic(name, 1, 1, "", "error", message)], False

    try:
        return read_text(path), [], True
    except YAMLLoadError as exc:
        return None, list(exc.diagnostics), True
    except IsADirectoryError:
        return unreadable(f"is a directory, not {kind}")
    except NotRegularFile as exc:
        return unreadable(f"{exc.strerror}; expected {kind}")
    except FileNotFoundError:
        return unreadable("no such file; check the path")
    except PermissionError:
        return unreadable("permission denied; make the file readable")
    except OSError as exc:
        return unreadable(f"cannot be read ({exc.strerror or exc})")


def located_yaml(text: str, filename: str = "<string>", *, keep_going: bool = False) -> LocatedDocument:
    """Parse one YAML document into plain data with positions. Raises :class:`YAMLLoadError`.

    A file that cannot be read as YAML, or crosses a bound, always raises. Problems in
    single values (a duplicate key, a refused tag, a scalar its tag cannot read) raise too,
    unless ``keep_going``: then the document comes back with them in ``doc.problems``, the
    refused values as None and their paths in ``doc.refused``, so a checker can report them
    beside its own findings (a duplicate key must not hide every other error).
    """
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        _decode(text.encode("utf-8", "surrogatepass")[: MAX_BYTES + 1], filename)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # only text handed over by a caller: a file is decoded strictly
        line, col = _line_col(text, exc.start)
        raise YAMLLoadError([Diagnostic(filename, line, col, "", "error",
                                        f"unpaired surrogate U+{ord(text[exc.start]):04X} is not a character; "
                                        "remove it")]) from None
    _check_lines(text, filename)
    doc = LocatedDocument(filename, None)
    try:
        prescan(yaml.parse(text, Loader=_Loader))
        Builder(doc).run(yaml.parse(text, Loader=_Loader))
    except Refused as exc:
        line, col = _end_of_text(text, *mark_pos(exc.mark)) if exc.mark else (1, 1)
        raise YAMLLoadError([Diagnostic(filename, line, col, exc.path, "error", str(exc))]) from None
    except yaml.MarkedYAMLError as exc:
        raise YAMLLoadError([_yaml_error(exc, text, filename)]) from None
    except yaml.YAMLError as exc:  # ReaderError: control characters
        raise YAMLLoadError([_reader_error(exc, text, filename)]) from None
    except RecursionError:
        raise YAMLLoadError([Diagnostic(filename, 1, 1, "", "error", "document nested too deeply")]) from None
    _clamp(doc, text)
    if doc.problems and not keep_going:
        raise YAMLLoadError(doc.problems)
    return doc


def _end_of_text(text: str, line: int, col: int) -> tuple[int, int]:
    """(line, col), or the end of the text's last line for a mark past it: libyaml puts the
    end of a stream that lacks a final line break on the line after the last (a file of 4
    lines got an error at 5:1)."""
    lines = _BREAK.split(text)
    if line > len(lines):
        return len(lines), len(lines[-1]) + 1
    return line, col


def _clamp(doc: LocatedDocument, text: str) -> None:
    last = _BREAK.split(text)
    n = len(last)
    if not any(line > n for line, _ in doc.value_pos.values()) and not any(d.line > n for d in doc.problems):
        return
    for table in (doc.value_pos, doc.key_pos):
        for path, (line, col) in table.items():
            table[path] = _end_of_text(text, line, col)
    doc.problems[:] = [Diagnostic(d.file, *_end_of_text(text, d.line, d.column), d.path, d.severity, d.message)
                       for d in doc.problems]


def _reader_error(exc: yaml.YAMLError, text: str, filename: str) -> Diagnostic:
    """A character YAML does not allow, located in characters (libyaml reports a byte offset)."""
    bad = _NON_PRINTABLE.search(text)
    index = bad.start() if bad else 0
    line, col = _line_col(text, index)
    what = f"U+{ord(text[index]):04X}" if bad else "a character"
    return Diagnostic(filename, line, col, "", "error",
                      f"unreadable character {what}: YAML allows no control characters; remove it")


def _yaml_error(exc: yaml.MarkedYAMLError, text: str, filename: str) -> Diagnostic:
    mark = exc.problem_mark or exc.context_mark
    line, col = _end_of_text(text, *mark_pos(mark)) if mark else (1, 1)
    problem = exc.problem or exc.context or "invalid YAML"
    lines = _BREAK.split(text)
    source_line = lines[line - 1] if mark and line - 1 < len(lines) else ""
    if "\t" in problem or "\\t" in problem or "\t" in source_line[: col + 1]:
        message = "tab character in indentation: YAML indents with spaces only; replace the tab with spaces"
    else:
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        message = f"invalid YAML: {problem}{context}"
    return Diagnostic(filename, line, col, "", "error", message)
