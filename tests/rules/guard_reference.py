"""The guard language's reference parser: lark on ``grammar.lark`` (the specification).

A test oracle: ``tests/rules/test_guard_parser.py`` checks that the project's own parser
(``torchfl.rules.guards.parser``) accepts the same texts and builds the same trees. lark is
a test dependency only.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from torchfl.rules.guards import syntax
from torchfl.rules.guards.syntax import (CONSTANTS, KEYWORDS, MAX_NODES, MAX_TREE_DEPTH, Attr, BinOp, BoolOp, Call,
                                         Compare, Comprehension, Const, GuardSyntaxError, IfElse, Index, ListComp,
                                         ListLit, Name, Neg, Node, Not, Slice, _prescan, number)


@lru_cache(maxsize=1)
def _parser():
    from lark import Lark

    grammar = (Path(syntax.__file__).with_name("grammar.lark")).read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


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
