"""Guard text -> our own expression tree, with hard limits checked before and after parsing.

The tree is made of the small frozen dataclasses below; nothing here (or anywhere in the
guard language) calls ``eval``, ``exec``, ``compile`` or evaluates Python's ``ast``.
Limits make a hostile pack cheap to refuse: the text length is checked before the parser sees
it, bracket depth by a linear scan, tree depth and size iteratively after parsing (so no
recursion can overflow), and names beginning with ``_`` (``__import__``, ``__class__``)
are refused outright.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MAX_CHARS = 2000
MAX_BRACKET_DEPTH = 16
MAX_TREE_DEPTH = 48
MAX_NODES = 400
MAX_INT = 1 << 62


class GuardSyntaxError(Exception):
    """A guard that cannot be accepted; ``offset`` is the 0-based character index in the guard."""

    def __init__(self, message: str, offset: int = 0):
        super().__init__(message)
        self.message = message
        self.offset = offset


@dataclass(frozen=True)
class Node:
    start: int  # 0-based offsets into the guard text, for located messages and explanations
    end: int


@dataclass(frozen=True)
class Const(Node):
    value: Any


@dataclass(frozen=True)
class Name(Node):
    id: str


@dataclass(frozen=True)
class Attr(Node):
    obj: Node
    name: str


@dataclass(frozen=True)
class Index(Node):
    obj: Node
    index: Node


@dataclass(frozen=True)
class Slice(Node):
    obj: Node
    lower: Node | None
    upper: Node | None


@dataclass(frozen=True)
class Unary(Node):
    """An operator applied to one operand."""

    operand: Node


class Neg(Unary):
    """``-operand``"""


class Not(Unary):
    """``not operand``"""


@dataclass(frozen=True)
class BinOp(Node):
    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class BoolOp(Node):
    op: str  # "and" | "or"
    values: tuple[Node, ...]


@dataclass(frozen=True)
class Compare(Node):
    left: Node
    ops: tuple[str, ...]
    comparators: tuple[Node, ...]


@dataclass(frozen=True)
class ListLit(Node):
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Call(Node):
    func: str
    args: tuple[Node, ...]


@dataclass(frozen=True)
class IfElse(Node):
    body: Node
    test: Node
    orelse: Node


@dataclass(frozen=True)
class ListComp(Node):
    elt: Node
    var: str
    iter: Node


@dataclass(frozen=True)
class Comprehension(Node):
    func: str  # "all" | "any"
    elt: Node
    var: str
    iter: Node


def number(text: str, start: int, end: int, is_float: bool) -> Const:
    """A numeric literal, refused when it is beyond the language's range: integers up to
    2**62 (checked on the digits first: Python converts at most 4,300), floats finite."""
    if is_float:
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise GuardSyntaxError(f"number {text[:20]} is beyond the largest float (about 1.8e308)", start)
        return Const(start, end, value)
    if len(text.lstrip("0")) > 19 or int(text) > MAX_INT:
        raise GuardSyntaxError(f"number {text[:20]}{'...' if len(text) > 20 else ''} is too large; integers "
                               f"in guards are at most 2**62 ({MAX_INT:,})", start)
    return Const(start, end, int(text))


CONSTANTS = {"true": True, "True": True, "false": False, "False": False, "none": None, "None": None, "null": None}
KEYWORDS = {"and", "or", "not", "in", "for", "if", "else"}


def _prescan(text: str) -> None:
    if len(text) > MAX_CHARS:
        raise GuardSyntaxError(
            f"guard is {len(text):,} characters; the limit is {MAX_CHARS:,}. Split it into several guards", 0
        )
    depth, quote = 0, None
    for i, ch in enumerate(text):
        if ord(ch) < 32 and ch not in "\t\r\n":
            raise GuardSyntaxError(f"control character U+{ord(ch):04X} in guard", i)
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([":
            depth += 1
            if depth > MAX_BRACKET_DEPTH:
                raise GuardSyntaxError(f"brackets nested deeper than {MAX_BRACKET_DEPTH} levels; simplify the guard", i)
        elif ch in ")]":
            depth -= 1
        elif ch == "_" and text[i : i + 2] == "__":
            raise GuardSyntaxError(
                "'__' refused: dunder names (__import__, __class__, ...) are not part of the guard language", i
            )
        elif ord(ch) < 32 and ch not in "\t\r\n":
            raise GuardSyntaxError(f"control character U+{ord(ch):04X} in guard", i)


_DOTTED = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)*")


def _dotted(text: str) -> Node | None:
    """Fast path for the most common expressions (``input``, ``conv.weight``): no parser needed."""
    if len(text) > 200 or not _DOTTED.fullmatch(text):
        return None
    parts = text.split(".")
    if parts[0] in CONSTANTS or any(p in KEYWORDS for p in parts):
        return None
    node: Node = Name(0, len(parts[0]), parts[0])
    end = len(parts[0])
    for part in parts[1:]:
        end += 1 + len(part)
        node = Attr(0, end, node, part)
    return node


@lru_cache(maxsize=4096)
def parse(text: str) -> Node:
    """Parse one guard. Raises :class:`GuardSyntaxError` (never anything else) for bad text."""
    if not isinstance(text, str):
        raise GuardSyntaxError(f"a guard must be text, got {type(text).__name__}")
    fast = _dotted(text)
    if fast is not None:
        return fast
    if not text.strip():
        raise GuardSyntaxError("empty guard")
    _prescan(text)
    from torchfl.rules.guards.parser import parse_text

    return parse_text(text)


def source(text: str, node: Node) -> str:
    """The guard text of a sub-expression, for messages."""
    return text[node.start : node.end]
