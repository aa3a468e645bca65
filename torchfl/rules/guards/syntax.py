"""Guard text -> our own expression tree, with hard limits checked before and after parsing.

The tree is made of the small frozen dataclasses below; nothing here (or anywhere in the
guard language) calls ``eval``, ``exec``, ``compile`` or evaluates Python's ``ast``.
Limits make a hostile pack cheap to refuse: the text length is checked before lark sees
it, bracket depth by a linear scan, tree depth and size iteratively after parsing (so no
recursion can overflow), and names beginning with ``_`` (``__import__``, ``__class__``)
are refused outright.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
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
class Neg(Node):
    operand: Node


@dataclass(frozen=True)
class Not(Node):
    operand: Node


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


@lru_cache(maxsize=1)
def _parser():
    from lark import Lark

    grammar = (Path(__file__).with_name("grammar.lark")).read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


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


def _check_shape(tree) -> None:
    """Iterative depth/size check of the lark tree, before any recursive conversion."""
    from lark import Tree

    stack, count = [(tree, 1)], 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise GuardSyntaxError(f"guard has more than {MAX_NODES} parts; split it into several guards", 0)
        if depth > MAX_TREE_DEPTH:
            start = getattr(getattr(node, "meta", None), "start_pos", 0) or 0
            raise GuardSyntaxError(f"expression nested deeper than {MAX_TREE_DEPTH} levels; simplify the guard", start)
        if isinstance(node, Tree):
            stack.extend((child, depth + 1) for child in node.children if child is not None)


def _describe_unexpected(exc, text: str) -> GuardSyntaxError:
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

    if isinstance(exc, UnexpectedCharacters):
        ch = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        hint = ""
        if ch in "=" :
            hint = " (use == to compare)"
        elif ch in "&|":
            hint = " (use 'and' / 'or')"
        elif ch == "!":
            hint = " (use 'not', or != to compare)"
        return GuardSyntaxError(f"unexpected character {ch!r}{hint}", exc.pos_in_stream)
    if isinstance(exc, UnexpectedEOF):
        return GuardSyntaxError("guard ends too early (unclosed bracket or missing operand)", len(text))
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        if tok.type == "$END":
            return GuardSyntaxError("guard ends too early (unclosed bracket or missing operand)", len(text))
        extra = ""
        if str(tok) == "(" and text[: tok.start_pos].rstrip()[-1:].isalnum():
            extra = " (only len, min, max, abs, all and any can be called; there are no methods)"
        if str(tok) == "*" and "**" in text[max(0, tok.start_pos - 1) : tok.start_pos + 2]:
            extra = " ('**' is not part of the guard language)"
        return GuardSyntaxError(f"unexpected {str(tok)!r}{extra}", tok.start_pos or 0)
    return GuardSyntaxError(f"syntax error: {exc}", 0)


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


def parse_reference(text: str) -> Node:
    """The same, through lark and ``grammar.lark`` (the specification; used by the tests)."""
    from lark.exceptions import LarkError

    if not text.strip():
        raise GuardSyntaxError("empty guard")
    _prescan(text)
    try:
        tree = _parser().parse(text)
    except LarkError as exc:
        raise _describe_unexpected(exc, text) from None
    _check_shape(tree)
    return _Convert(text).node(tree)


class _Convert:
    """lark tree -> :class:`Node` (depth already bounded, so recursion is safe)."""

    def __init__(self, text: str):
        self.text = text

    @staticmethod
    def _span(t) -> tuple[int, int]:
        from lark import Token

        if isinstance(t, Token):
            return t.start_pos, t.end_pos
        return t.meta.start_pos, t.meta.end_pos

    def _name(self, tok) -> str:
        name = str(tok)
        if name in KEYWORDS:  # lark's contextual lexer lets a keyword through where it cannot be one
            raise GuardSyntaxError(f"unexpected {name!r}", tok.start_pos)
        if name.startswith("_"):
            raise GuardSyntaxError(
                f"name {name!r} refused: names starting with '_' (private or dunder access) are not part of "
                "the guard language",
                tok.start_pos,
            )
        return name

    def node(self, t) -> Node:
        from lark import Token

        if isinstance(t, Token):  # a bare atom that lark inlined
            raise GuardSyntaxError(f"unexpected {str(t)!r}", t.start_pos)
        s, e = self._span(t)
        kind, ch = t.data, t.children
        if kind in ("int_", "float_"):
            return number(str(ch[0]), s, e, kind == "float_")
        if kind == "string":
            return Const(s, e, str(ch[0])[1:-1])
        if kind == "name":
            raw = str(ch[0])
            if raw in CONSTANTS:
                return Const(s, e, CONSTANTS[raw])
            return Name(s, e, self._name(ch[0]))
        if kind == "list_":
            return ListLit(s, e, tuple(self.node(c) for c in ch if c is not None))
        if kind == "attr":
            return Attr(s, e, self.node(ch[0]), self._name(ch[1]))
        if kind == "index":
            return Index(s, e, self.node(ch[0]), self.node(ch[1]))
        if kind == "slice":
            lo, hi = ch[1], ch[2]
            return Slice(s, e, self.node(ch[0]), None if lo is None else self.node(lo), None if hi is None else self.node(hi))
        if kind == "neg":
            inner = self.node(ch[0])
            if isinstance(inner, Const) and isinstance(inner.value, (int, float)) and not isinstance(inner.value, bool):
                return Const(s, e, -inner.value)
            return Neg(s, e, inner)
        if kind == "not_":
            return Not(s, e, self.node(ch[0]))
        if kind == "binop":
            return BinOp(s, e, str(ch[1]), self.node(ch[0]), self.node(ch[2]))
        if kind in ("and_", "or_"):
            op = kind[:-1]
            values: list[Node] = []
            for c in ch:
                n = self.node(c)
                if isinstance(n, BoolOp) and n.op == op:
                    values.extend(n.values)
                else:
                    values.append(n)
            return BoolOp(s, e, op, tuple(values))
        if kind == "compare":
            left = self.node(ch[0])
            ops, comps = [], []
            for op_tree, operand in zip(ch[1::2], ch[2::2]):
                ops.append(" ".join(str(tok) for tok in op_tree.children))
                comps.append(self.node(operand))
            return Compare(s, e, left, tuple(ops), tuple(comps))
        if kind == "call":
            func = self._name(ch[0])
            return Call(s, e, func, tuple(self.node(c) for c in ch[1:] if c is not None))
        if kind == "ternary":
            return IfElse(s, e, self.node(ch[0]), self.node(ch[1]), self.node(ch[2]))
        if kind == "listcomp":
            return ListComp(s, e, self.node(ch[0]), self._name(ch[1]), self.node(ch[2]))
        if kind == "comprehension":
            func = self._name(ch[0])
            return Comprehension(s, e, func, self.node(ch[1]), self._name(ch[2]), self.node(ch[3]))
        raise GuardSyntaxError(f"unsupported construct {kind!r}", s)  # pragma: no cover - grammar and code agree


def source(text: str, node: Node) -> str:
    """The guard text of a sub-expression, for messages."""
    return text[node.start : node.end]
