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
import stat
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from yaml.constructor import SafeConstructor

from torchfl.hcd.diagnostics import Diagnostic, YAMLLoadError, format_path

MAX_BYTES = 1 << 20  # 1 MiB: an HCD is ~2 KB, the bundled rule pack ~40 KB; anything larger is a mistake
MAX_LINE = 8192  # characters; the longest guard is 2,000
MAX_DEPTH = 64
MAX_ALIASES = 32
MAX_NODES = 50_000  # values, aliases expanded; an HCD has ~60, the bundled rule pack ~2,000
MAX_NUMBER_CHARS = 40  # text of one number: 2**63 has 19 digits, a float's exact form ~25

_PLAIN_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:timestamp",  # kept as the source text
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
}

_NUMBER_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}

Path_ = tuple  # a path into the document: keys (str) and list indices (int)


@dataclass
class LocatedDocument:
    """Plain data (dicts, lists, scalars) plus the 1-based position of every key and value."""

    filename: str
    data: object
    value_pos: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    key_pos: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: Path_, *, key: bool = False) -> tuple[int, int]:
        """Position of ``path`` (its key when ``key``), else of its nearest located ancestor."""
        path = tuple(path)
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
        line, col = self.where(path, key=key)
        return Diagnostic(self.filename, line, col, format_path(path), severity, message)


class _Refused(Exception):
    def __init__(self, message: str, mark=None):
        super().__init__(message)
        self.mark = mark


# libyaml (C) when PyYAML has it: ~10x faster than the pure-Python scanner, which matters
# for the CLI's cold-start budget. Both yield the same nodes and marks.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


def _check_lines(text: str, filename: str) -> None:
    """Refuse a line longer than MAX_LINE characters, naming it and its length."""
    for number, line in enumerate(text.split("\n"), 1):
        if len(line) > MAX_LINE:
            raise YAMLLoadError([Diagnostic(filename, number, MAX_LINE + 1, "", "error",
                                            f"line {number} is {len(line):,} characters long; the limit is "
                                            f"{MAX_LINE:,}. Break long lists over several lines (one item per "
                                            "line) or split the guard")])


def _prescan(text: str) -> None:
    """Refuse deep nesting, many aliases and too many values from the event stream, before
    composing; stops at the first limit crossed, so a hostile file costs little."""
    depth = aliases = values = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, _OPEN):
            depth += 1
            values += 1
            if depth > MAX_DEPTH:
                raise _Refused(f"nesting deeper than {MAX_DEPTH} levels (the limit); an HCD or rule pack is "
                               "a few levels deep", event.start_mark)
        elif isinstance(event, _CLOSE):
            depth -= 1
        elif isinstance(event, yaml.ScalarEvent):
            values += 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise _Refused(f"more than {MAX_ALIASES} aliases (*name), the limit: torchfl refuses alias-heavy "
                               "documents (a 'billion laughs' guard); write the values out", event.start_mark)
        if values > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES:,} values (keys, items and scalars; the limit) by this point; "
                           "an HCD has about 60 and the bundled rule pack about 2,000. Is this the right file?",
                           event.start_mark)


def _pos(mark) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1)


def _decode(raw: bytes, filename: str) -> str:
    def fail(offset: int, message: str):
        before = raw[:offset]
        line = before.count(b"\n") + 1
        col = offset - (before.rfind(b"\n") + 1) + 1
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


def located_yaml(text: str, filename: str = "<string>") -> LocatedDocument:
    """Parse one YAML document into plain data with positions. Raises :class:`YAMLLoadError`."""
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        _decode(text.encode("utf-8", "surrogatepass")[: MAX_BYTES + 1], filename)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # only text handed over by a caller: a file is decoded strictly
        before = text[: exc.start]
        line, col = before.count("\n") + 1, exc.start - (before.rfind("\n") + 1) + 1
        raise YAMLLoadError([Diagnostic(filename, line, col, "", "error",
                                        f"unpaired surrogate U+{ord(text[exc.start]):04X} is not a character; "
                                        "remove it")]) from None
    _check_lines(text, filename)
    try:
        _prescan(text)
        root = yaml.compose(text, Loader=_Loader)
    except _Refused as exc:
        line, col = _pos(exc.mark) if exc.mark else (1, 1)
        raise YAMLLoadError([Diagnostic(filename, line, col, "", "error", str(exc))]) from None
    except yaml.MarkedYAMLError as exc:
        raise YAMLLoadError([_yaml_error(exc, text, filename)]) from None
    except yaml.YAMLError as exc:  # ReaderError: control characters
        position = getattr(exc, "position", 0) or 0
        before = text[:position]
        line, col = before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1
        raise YAMLLoadError(
            [Diagnostic(filename, line, col, "", "error", f"unreadable character: {exc}; remove it")]
        ) from None
    except RecursionError:
        raise YAMLLoadError([Diagnostic(filename, 1, 1, "", "error", "document nested too deeply")]) from None
    if root is not None and _expanded_size(root, {}) > MAX_NODES:
        line, col = _pos(root.start_mark)
        raise YAMLLoadError([Diagnostic(filename, line, col, "", "error",
                                        f"aliases expand the document to more than {MAX_NODES:,} values "
                                        "(the limit); write the values out instead of repeating aliases")])
    doc = LocatedDocument(filename, None)
    if root is None:
        raise YAMLLoadError([Diagnostic(filename, 1, 1, "", "error", "the file is empty; expected a YAML mapping")])
    builder = _Builder(doc)
    doc.data = builder.build(root, ())
    if builder.problems:
        raise YAMLLoadError(builder.problems)
    return doc


def _expanded_size(node, memo: dict) -> int:
    """Number of values ``node`` expands to, aliases counted each time; linear in unique nodes."""
    key = id(node)
    if key not in memo:
        memo[key] = 0  # a recursive alias cycle counts as empty, then is refused below
        if isinstance(node, yaml.MappingNode):
            memo[key] = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            memo[key] = 1 + sum(_expanded_size(v, memo) for v in node.value)
        else:
            memo[key] = 1
    return memo[key]


def _yaml_error(exc: yaml.MarkedYAMLError, text: str, filename: str) -> Diagnostic:
    mark = exc.problem_mark or exc.context_mark
    line, col = _pos(mark) if mark else (1, 1)
    problem = exc.problem or exc.context or "invalid YAML"
    source_line = text.splitlines()[line - 1] if mark and line - 1 < len(text.splitlines()) else ""
    if "\t" in problem or "\\t" in problem or "\t" in source_line[: col + 1]:
        message = "tab character in indentation: YAML indents with spaces only; replace the tab with spaces"
    else:
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        message = f"invalid YAML: {problem}{context}"
    return Diagnostic(filename, line, col, "", "error", message)


class _Builder:
    """Turns composed nodes into plain values, recording positions and refusing what is unsafe."""

    def __init__(self, doc: LocatedDocument):
        self.doc = doc
        self.problems: list[Diagnostic] = []
        self.nodes = 0
        self.scalars = SafeConstructor()
        self.active: set[int] = set()  # ids of the nodes being built: a cycle is an error

    def _problem(self, node, path, message):
        line, col = _pos(node.start_mark)
        self.problems.append(Diagnostic(self.doc.filename, line, col, format_path(path), "error", message))

    def build(self, node, path):
        self.nodes += 1
        if self.nodes > MAX_NODES:
            line, col = _pos(node.start_mark)
            raise YAMLLoadError(
                [Diagnostic(self.doc.filename, line, col, format_path(path), "error",
                            f"aliases expand the document to more than {MAX_NODES:,} values (the limit); "
                            "write the values out instead of repeating aliases")]
            )
        self.doc.value_pos.setdefault(path, _pos(node.start_mark))
        if id(node) in self.active:
            self._problem(node, path, "recursive alias: a value contains itself; write the values out")
            return None
        if node.tag not in _PLAIN_TAGS:
            self._problem(node, path, f"YAML tag {node.tag!r} is not allowed: torchfl files hold plain data only")
            return None
        self.active.add(id(node))
        try:
            return self._build(node, path)
        finally:
            self.active.discard(id(node))

    def _build(self, node, path):
        if isinstance(node, yaml.MappingNode):
            out: dict = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:null":
                    self._problem(key_node, path, "mapping keys must be plain names")
                    continue
                key = key_node.value
                if key == "<<":
                    self._problem(key_node, path, "merge keys (<<) are not allowed; write the fields out")
                    continue
                if key in out:
                    first = self.doc.key_pos.get(path + (key,), (0, 0))
                    self._problem(key_node, path + (key,),
                                  f"duplicate key {key!r} (first defined at line {first[0]}); keep only one")
                    continue
                self.doc.key_pos[path + (key,)] = _pos(key_node.start_mark)
                out[key] = self.build(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        if node.tag == "tag:yaml.org,2002:timestamp":
            return node.value
        if node.tag in _NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
            digits = sum(ch.isalnum() for ch in node.value)
            self._problem(node, path, f"a number of {digits:,} digits ({node.value[:12]}...) is far outside any "
                                      f"plausible value (numbers are at most {MAX_NUMBER_CHARS} characters); "
                                      "write the intended value")
            return None
        try:
            return self.scalars.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self._problem(node, path, f"cannot read value {node.value!r}: {exc}")
            return None
