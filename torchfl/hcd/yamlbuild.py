"""Plain values from YAML's event stream, with every bound checked before the work it protects.

:func:`prescan` refuses deep nesting, many aliases and alias expansion from the events alone,
before anything is built; :class:`Builder` then builds dicts, lists and scalars, records the
position of every key and value in a ``LocatedDocument``, and reports duplicate keys, tags and
unreadable scalars as located problems. ``hcd/source.py`` reads the text and calls both.
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING

import yaml
from yaml.constructor import SafeConstructor

from torchfl.hcd.diagnostics import Diagnostic, format_path

if TYPE_CHECKING:
    from torchfl.hcd.source import LocatedDocument

MAX_DEPTH = 64
MAX_ALIASES = 32
MAX_NODES = 50_000  # values, aliases expanded; an HCD has ~60, the bundled rule pack ~2,000
MAX_NUMBER_CHARS = 40  # text of one number: 2**63 has 19 digits, a float's exact form ~25

_OPEN = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_CLOSE = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


class Refused(Exception):
    """A bound crossed or a document YAML cannot hold: the whole load stops here."""

    def __init__(self, message: str, mark=None, path: tuple = ()):
        super().__init__(message)
        self.mark = mark
        self.path = format_path(path)


def too_deep(mark) -> Refused:
    return Refused(f"nesting deeper than {MAX_DEPTH} levels (the limit); an HCD or rule pack is "
                   "a few levels deep", mark)


def too_many_aliases(mark) -> Refused:
    return Refused(f"more than {MAX_ALIASES} aliases (*name), the limit: torchfl refuses alias-heavy "
                   "documents (a 'billion laughs' guard); write the values out", mark)


def too_many_values(mark, path: tuple = ()) -> Refused:
    return Refused(f"more than {MAX_NODES:,} values (keys, items and scalars; the limit) by this point; "
                   "an HCD has about 60 and the bundled rule pack about 2,000. Is this the right file?",
                   mark, path)


def expands_too_far(mark, path: tuple = ()) -> Refused:
    return Refused(f"aliases expand the document to more than {MAX_NODES:,} values (the limit); "
                   "write the values out instead of repeating aliases", mark, path)


def mark_pos(mark) -> tuple[int, int]:
    """1-based (line, column) of a YAML mark."""
    return (mark.line + 1, mark.column + 1)


def prescan(events) -> None:
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
                raise too_deep(event.start_mark)
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
                raise too_many_aliases(event.start_mark)
            stack[-1][0] += sizes.get(event.anchor, 0)  # unknown or open (a cycle): the builder reports it
        if values > MAX_NODES:
            raise too_many_values(event.start_mark)
        if stack[-1][0] > MAX_NODES or sum(entry[0] for entry in stack) > MAX_NODES:
            raise expands_too_far(event.start_mark)


_TAG = "tag:yaml.org,2002:"
_RESOLVER = yaml.resolver.Resolver()
_IMPLICIT = {tag: regexp for regexps in yaml.resolver.Resolver.yaml_implicit_resolvers.values()
             for tag, regexp in regexps}
# a plain scalar YAML 1.2 (core schema) reads as a float and YAML 1.1 as a string: an exponent
# without a dot (1e-3, 2E+5); PyYAML resolves 1.1 only, so `sustained_fraction: 1e-3` was text
_YAML12_FLOAT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+")
_SCALAR_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "null": "null (~)",
                 "timestamp": "a date"}


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_TAG):] if tag.startswith(_TAG) else tag


class Builder:
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
        line, col = mark_pos(mark)
        self.doc.problems.append(Diagnostic(self.doc.filename, line, col, format_path(path), "error", message))
        if refuse:
            self.doc.refused.add(path)

    def _count(self, n: int, mark, path: tuple, aliased: bool = False) -> None:
        self.values += n
        if self.values > MAX_NODES:
            if aliased:
                raise expands_too_far(mark, path)
            raise too_many_values(mark, path)

    # -- the stream --
    def run(self, events) -> None:
        self.events = iter(events)
        next(self.events)  # StreamStart
        event = next(self.events)
        if isinstance(event, yaml.StreamEndEvent):
            raise Refused("the file is empty; expected a YAML mapping", None)
        self.doc.data = self.node(next(self.events), ())
        next(self.events)  # DocumentEnd
        event = next(self.events)
        if isinstance(event, yaml.DocumentStartEvent):
            raise Refused("invalid YAML: but found another document (expected a single document in the "
                           "stream); keep one document per file", event.start_mark)

    def node(self, event, path: tuple):
        """Build the value that starts with ``event`` at ``path``; returns it."""
        if isinstance(event, yaml.AliasEvent):
            return self.alias(event, path)
        anchor = event.anchor
        if anchor is not None and (anchor in self.anchors or anchor in self.open_anchors):
            first = self.anchors[anchor][4] if anchor in self.anchors else None
            where = f" (first at line {first.line + 1})" if first else ""
            raise Refused(f"invalid YAML: the anchor &{anchor} is defined twice{where}; rename one", event.start_mark)
        if anchor is not None:
            self.open_anchors.add(anchor)
            start_log, start_values = len(self.log), self.values
        self._at("v", path, mark_pos(event.start_mark))
        self._count(1, event.start_mark, path)
        if isinstance(event, yaml.ScalarEvent):
            value = self.scalar(event, path)
        else:
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise too_deep(event.start_mark)
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
            raise too_many_aliases(event.start_mark)
        name = event.anchor
        if name in self.open_anchors:
            self._problem(event.start_mark, path, "recursive alias: a value contains itself; write the values out")
            return None
        if name not in self.anchors:
            raise Refused(f"invalid YAML: found undefined alias *{name}; define it with &{name} before its use",
                           event.start_mark)
        value, size, recorded, refused, _mark = self.anchors[name]
        self._count(size, event.start_mark, path, aliased=True)
        use = mark_pos(event.start_mark)
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
            self._at("k", path + (key,), mark_pos(event.start_mark))
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
            tag = _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)
            if tag == _TAG + "str" and event.implicit[0] and _YAML12_FLOAT.fullmatch(event.value):
                return _TAG + "float"    # YAML 1.2's number (1e-3): YAML 1.1 wants a dot (1.0e-3)
            return tag
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
