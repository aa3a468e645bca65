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

import copy
import errno
import os
import re
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


class _Refused(Exception):
    def __init__(self, message: str, mark=None, path: tuple = ()):
        super().__init__(message)
        self.mark = mark
        self.path = format_path(path)


# libyaml (C) when PyYAML has it: ~10x faster than the pure-Python scanner, which matters
# for the CLI's cold-start budget. Both yield the same nodes and marks.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
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


def _prescan(events) -> None:
    """Refuse deep nesting, many aliases, too many values and alias expansion from the event
    stream, before building anything; stops at the first limit crossed, so a hostile file
    costs little (the expanded size of each anchor is summed as its events pass)."""
    depth = aliases = values = 0
    sizes: dict[str, int] = {}
    stack = [[0, None]]  # per open collection: [expanded size so far, its anchor]
    for event in events:
        if isinstance(event, _OPEN):
            depth += 1
            values += 1
            if depth > MAX_DEPTH:
                raise _Refused(f"nesting deeper than {MAX_DEPTH} levels (the limit); an HCD or rule pack is "
                               "a few levels deep", event.start_mark)
            stack.append([1, event.anchor])
        elif isinstance(event, _CLOSE):
            depth -= 1
            size, anchor = stack.pop()
            if anchor is not None:
                sizes[anchor] = size
            stack[-1][0] += size
        elif isinstance(event, yaml.ScalarEvent):
            values += 1
            stack[-1][0] += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise _Refused(f"more than {MAX_ALIASES} aliases (*name), the limit: torchfl refuses alias-heavy "
                               "documents (a 'billion laughs' guard); write the values out", event.start_mark)
            stack[-1][0] += sizes.get(event.anchor, 0)  # unknown or open (a cycle): the builder reports it
        if values > MAX_NODES:
            raise _Refused(f"more than {MAX_NODES:,} values (keys, items and scalars; the limit) by this point; "
                           "an HCD has about 60 and the bundled rule pack about 2,000. Is this the right file?",
                           event.start_mark)
        if stack[-1][0] > MAX_NODES or sum(entry[0] for entry in stack) > MAX_NODES:
            raise _Refused(f"aliases expand the document to more than {MAX_NODES:,} values (the limit); "
                           "write the values out instead of repeating aliases", event.start_mark)


def _pos(mark) -> tuple[int, int]:
    return (mark.line + 1, mark.column + 1)


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
        _prescan(yaml.parse(text, Loader=_Loader))
        _Builder(doc).run(yaml.parse(text, Loader=_Loader))
    except _Refused as exc:
        line, col = _end_of_text(text, *_pos(exc.mark)) if exc.mark else (1, 1)
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
    line, col = _end_of_text(text, *_pos(mark)) if mark else (1, 1)
    problem = exc.problem or exc.context or "invalid YAML"
    lines = _BREAK.split(text)
    source_line = lines[line - 1] if mark and line - 1 < len(lines) else ""
    if "\t" in problem or "\\t" in problem or "\t" in source_line[: col + 1]:
        message = "tab character in indentation: YAML indents with spaces only; replace the tab with spaces"
    else:
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        message = f"invalid YAML: {problem}{context}"
    return Diagnostic(filename, line, col, "", "error", message)


# ----------------------------------------------------------------------------- building

_TAG = "tag:yaml.org,2002:"
_RESOLVER = yaml.resolver.Resolver()
_IMPLICIT = {tag: regexp for regexps in yaml.resolver.Resolver.yaml_implicit_resolvers.values()
             for tag, regexp in regexps}
_SCALAR_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "null": "null (~)",
                 "timestamp": "a date"}


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_TAG):] if tag.startswith(_TAG) else tag


class _Builder:
    """Builds plain values from the event stream, checking every bound as it goes.

    Working on events rather than composed nodes keeps what the composer forgets: where
    an alias is used (an error in an aliased value points there, naming the anchor), and
    whether a tag was written. Bounds are checked before the work they protect: depth
    and alias count on each event, the number of values with aliases expanded before an
    alias is copied.
    """

    def __init__(self, doc: LocatedDocument):
        self.doc = doc
        self.values = 0
        self.aliases = 0
        self.depth = 0
        self.anchors: dict[str, tuple] = {}  # name -> (value, size, [(kind, relpath, pos)], mark)
        self.open_anchors: set[str] = set()  # being built: an alias to one is a cycle
        self.log: list[tuple[str, tuple, tuple[int, int]]] = []  # ("v"|"k", path, pos) as recorded

    # -- recording --
    def _at(self, kind: str, path: tuple, pos: tuple[int, int]) -> None:
        table = self.doc.value_pos if kind == "v" else self.doc.key_pos
        if path not in table:
            table[path] = pos
            self.log.append((kind, path, pos))

    def _problem(self, mark, path: tuple, message: str, *, refuse: bool = True) -> None:
        """Report a problem; ``refuse``: the value at ``path`` is dropped (None), so a checker
        leaves that path alone (one problem, one diagnostic)."""
        line, col = _pos(mark)
        self.doc.problems.append(Diagnostic(self.doc.filename, line, col, format_path(path), "error", message))
        if refuse:
            self.doc.refused.add(path)

    def _count(self, n: int, mark, path: tuple, aliased: bool = False) -> None:
        self.values += n
        if self.values > MAX_NODES:
            if aliased:
                raise _Refused(f"aliases expand the document to more than {MAX_NODES:,} values (the limit); "
                               "write the values out instead of repeating aliases", mark, path)
            raise _Refused(f"more than {MAX_NODES:,} values (keys, items and scalars; the limit) by this point; "
                           "an HCD has about 60 and the bundled rule pack about 2,000. Is this the right file?",
                           mark, path)

    # -- the stream --
    def run(self, events) -> None:
        self.events = iter(events)
        next(self.events)  # StreamStart
        event = next(self.events)
        if isinstance(event, yaml.StreamEndEvent):
            raise _Refused("the file is empty; expected a YAML mapping", None)
        self.doc.data = self.node(next(self.events), ())
        next(self.events)  # DocumentEnd
        event = next(self.events)
        if isinstance(event, yaml.DocumentStartEvent):
            raise _Refused("invalid YAML: but found another document (expected a single document in the "
                           "stream); keep one document per file", event.start_mark)

    def node(self, event, path: tuple):
        """Build the value that starts with ``event`` at ``path``; returns it."""
        if isinstance(event, yaml.AliasEvent):
            return self.alias(event, path)
        anchor = event.anchor
        if anchor is not None and (anchor in self.anchors or anchor in self.open_anchors):
            first = self.anchors[anchor][4] if anchor in self.anchors else None
            where = f" (first at line {first.line + 1})" if first else ""
            raise _Refused(f"invalid YAML: the anchor &{anchor} is defined twice{where}; rename one", event.start_mark)
        if anchor is not None:
            self.open_anchors.add(anchor)
            start_log, start_values = len(self.log), self.values
        self._at("v", path, _pos(event.start_mark))
        self._count(1, event.start_mark, path)
        if isinstance(event, yaml.ScalarEvent):
            value = self.scalar(event, path)
        else:
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Refused(f"nesting deeper than {MAX_DEPTH} levels (the limit); an HCD or rule pack is "
                               "a few levels deep", event.start_mark)
            value = self.mapping(event, path) if isinstance(event, yaml.MappingStartEvent) else self.sequence(event, path)
            self.depth -= 1
        if anchor is not None:
            self.open_anchors.discard(anchor)
            n = len(path)
            recorded = [(kind, p[n:], pos) for kind, p, pos in self.log[start_log:] if p[:n] == path]
            refused = [p[n:] for p in self.doc.refused if p[:n] == path]
            self.anchors[anchor] = (value, self.values - start_values, recorded, refused, event.start_mark)
        return value

    def alias(self, event, path: tuple):
        self.aliases += 1
        if self.aliases > MAX_ALIASES:
            raise _Refused(f"more than {MAX_ALIASES} aliases (*name), the limit: torchfl refuses alias-heavy "
                           "documents (a 'billion laughs' guard); write the values out", event.start_mark)
        name = event.anchor
        if name in self.open_anchors:
            self._problem(event.start_mark, path, "recursive alias: a value contains itself; write the values out")
            return None
        if name not in self.anchors:
            raise _Refused(f"invalid YAML: found undefined alias *{name}; define it with &{name} before its use",
                           event.start_mark)
        value, size, recorded, refused, _mark = self.anchors[name]
        self._count(size, event.start_mark, path, aliased=True)
        use = _pos(event.start_mark)
        self.doc.aliases.setdefault(path, (use, name))
        for kind, rel, pos in recorded:  # where the anchor wrote them; where() answers the alias use
            self._at(kind, path + rel, pos)
        self.doc.refused.update(path + rel for rel in refused)
        return copy.deepcopy(value)

    def mapping(self, start, path: tuple) -> dict | None:
        out: dict = {}
        tag_ok = self._collection_tag(start, path, "map", "a mapping")
        while True:
            event = next(self.events)
            if isinstance(event, yaml.MappingEndEvent):
                return out if tag_ok else None
            key = self.key(event, path)
            value_event = next(self.events)
            if key is None:
                self.skip(value_event, path)
                continue
            if key == "<<":
                self._problem(event.start_mark, path, "merge keys (<<) are not allowed; write the fields out",
                              refuse=False)
                self.skip(value_event, path)
                continue
            if key in out:
                first = self.doc.key_pos.get(path + (key,), (0, 0))
                self._problem(event.start_mark, path + (key,),
                              f"duplicate key {key!r} (first defined at line {first[0]}); keep only one",
                              refuse=False)  # the first value stands and is checked
                self.skip(value_event, path)
                continue
            self._at("k", path + (key,), _pos(event.start_mark))
            out[key] = self.node(value_event, path + (key,))

    def key(self, event, path: tuple) -> str | None:
        """The text of a plain key, or None (reported) for anything else."""
        if isinstance(event, yaml.ScalarEvent):
            tag = self._scalar_tag(event)
            if tag == _TAG + "merge":
                return "<<"
            if tag != _TAG + "null" and tag.startswith(_TAG) and tag[len(_TAG):] in _SCALAR_TAGS:
                self._count(1, event.start_mark, path)
                return event.value
        self._problem(event.start_mark, path, "mapping keys must be plain names", refuse=False)
        self.skip(event, path)
        return None

    def skip(self, event, path: tuple) -> None:
        """Consume a value that is not kept (after a refused key), still counting its bounds."""
        saved = self.doc.problems[:], set(self.doc.refused)
        self.node(event, path + ("\0skipped",))
        self.doc.problems[:], self.doc.refused = saved

    def sequence(self, start, path: tuple) -> list | None:
        tag_ok = self._collection_tag(start, path, "seq", "a list")
        out = []
        while True:
            event = next(self.events)
            if isinstance(event, yaml.SequenceEndEvent):
                return out if tag_ok else None
            out.append(self.node(event, path + (len(out),)))

    def _collection_tag(self, event, path: tuple, kind: str, what: str) -> bool:
        if event.tag is None or event.tag in ("!", _TAG + kind):
            return True
        self._refuse_tag(event, path, event.tag, what)
        return False

    def _refuse_tag(self, event, path: tuple, tag: str, what: str) -> None:
        short = _short_tag(tag)
        name = tag[len(_TAG):] if tag.startswith(_TAG) else None
        if name in _SCALAR_TAGS or name in ("map", "seq"):
            self._problem(event.start_mark, path, f"the tag {short} does not fit {what}; remove the tag")
        else:
            self._problem(event.start_mark, path, f"YAML tag {short!r} is not allowed: torchfl files hold plain "
                                                  "data only; remove the tag")

    @staticmethod
    def _scalar_tag(event) -> str:
        if event.tag is None or event.tag == "!":
            return _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)
        return event.tag

    def scalar(self, event, path: tuple):
        """The value of a scalar under its tag (written or resolved), or None with a located problem.

        An explicit tag is honoured only where the text is what the tag says: ``!!int
        '0.9.1'`` or ``!!bool .`` is refused, never handed to PyYAML's constructors (which
        raise ValueError, KeyError or IndexError on such text).
        """
        tag = self._scalar_tag(event)
        name = tag[len(_TAG):] if tag.startswith(_TAG) else None
        if name not in _SCALAR_TAGS:
            self._refuse_tag(event, path, tag, "a single value")
            return None
        text = event.value
        if name == "str":
            return text
        if name in ("int", "float") and len(text) > MAX_NUMBER_CHARS:
            digits = sum(ch.isalnum() for ch in text)
            self._problem(event.start_mark, path,
                          f"a number of {digits:,} digits ({text[:12]}...) is far outside any plausible value "
                          f"(numbers are at most {MAX_NUMBER_CHARS} characters); write the intended value")
            return None
        try:
            return _SCALAR_TAGS[name](text)
        except (ValueError, KeyError, IndexError, TypeError, OverflowError):
            if event.tag not in (None, "!"):
                message = (f"{text!r} is tagged {_short_tag(tag)} but is not {_SCALAR_WORDS[name]}; remove the "
                           "tag, or quote the value if it is text")
            else:
                message = f"{text!r} is not a valid number; write the number, or quote it if it is text"
            self._problem(event.start_mark, path, message)
            return None


def _read_int(text: str) -> int:
    if not _IMPLICIT[_TAG + "int"].fullmatch(text):
        raise ValueError(text)
    return _CONSTRUCT.construct_yaml_int(yaml.ScalarNode(_TAG + "int", text))


def _read_float(text: str) -> float:
    if not text.replace("_", "").strip("+-"):
        raise ValueError(text)
    return _CONSTRUCT.construct_yaml_float(yaml.ScalarNode(_TAG + "float", text))


def _read_bool(text: str) -> bool:
    return _CONSTRUCT.bool_values[text.lower()]


def _read_null(text: str) -> None:
    if text and not _IMPLICIT[_TAG + "null"].fullmatch(text):
        raise ValueError(text)
    return None


def _read_timestamp(text: str) -> str:
    """A date stays its source text (an HCD has no dates; the text is what a user wrote)."""
    if not _IMPLICIT[_TAG + "timestamp"].fullmatch(text):
        raise ValueError(text)
    return text


_CONSTRUCT = SafeConstructor()
_SCALAR_TAGS = {"str": str, "int": _read_int, "float": _read_float, "bool": _read_bool, "null": _read_null,
                "timestamp": _read_timestamp}
