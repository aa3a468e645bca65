"""The guard parser: a small recursive-descent parser for ``grammar.lark``, with hard limits.

``grammar.lark`` is the specification; lark parses it in the tests
(:func:`torchfl.rules.guards.syntax.parse_reference`) and a differential test checks that
both parsers accept the same texts and build the same trees. This one exists because it
needs no grammar compilation at start-up (lark: ~0.3-1 s) and parses ~4x faster, which the CLI's
support queries feel (a pack is re-checked each time the registry hands it out).

Recursion is bounded: every nested construct passes through :meth:`_Parser.enter`, which
refuses more than ``MAX_TREE_DEPTH`` levels, and brackets were already bounded by the
pre-scan, so Python's own recursion limit is never approached.
"""

from __future__ import annotations

import re

from torchfl.rules.guards import syntax as S

_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+)
  | (?P<float>\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+(?:[eE][+-]?\d+)?)
  | (?P<int>\d+)
  | (?P<string>'[^'\\\n]*'|"[^"\\\n]*")
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|//|[<>+\-*/%()\[\],:.])
""", re.VERBOSE)

_COMPARE = {"==", "!=", "<", "<=", ">", ">="}


class _Tok:
    __slots__ = ("kind", "text", "start", "end")

    def __init__(self, kind, text, start, end):
        self.kind, self.text, self.start, self.end = kind, text, start, end

    def is_(self, *texts) -> bool:
        return self.kind in ("op", "kw") and self.text in texts


def _hint(ch: str) -> str:
    if ch == "=":
        return " (use == to compare)"
    if ch in "&|":
        return " (use 'and' / 'or')"
    if ch == "!":
        return " (use 'not', or != to compare)"
    return ""


def tokenize(text: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            ch = text[pos]
            raise S.GuardSyntaxError(f"unexpected character {ch!r}{_hint(ch)}", pos)
        kind = m.lastgroup
        if kind != "ws":
            value = m.group()
            if kind == "name" and value in S.KEYWORDS:
                kind = "kw"
            out.append(_Tok(kind, value, m.start(), m.end()))
        pos = m.end()
    out.append(_Tok("end", "", len(text), len(text)))
    return out


def parse_text(text: str) -> S.Node:
    """Text (already pre-scanned) -> tree. Raises GuardSyntaxError."""
    p = _Parser(text, tokenize(text))
    node = p.expr()
    if p.tok.kind != "end":
        p.unexpected()
    return node


class _Parser:
    def __init__(self, text: str, toks: list[_Tok]):
        self.text, self.toks, self.i, self.depth, self.count = text, toks, 0, 0, 0
        # id(node) -> (start, end including its parentheses, node): the node is held so that its
        # id cannot be reused by a later node while this parse runs (a folded ``-(1.)`` is dropped)
        self.extent: dict[int, tuple[int, int, S.Node]] = {}

    def lo(self, n: S.Node) -> int:
        return self.extent.get(id(n), (n.start, n.end))[0]

    def hi(self, n: S.Node) -> int:
        return self.extent.get(id(n), (n.start, n.end))[1]

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def peek(self, n: int = 1) -> _Tok:
        return self.toks[min(self.i + n, len(self.toks) - 1)]

    def advance(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def unexpected(self):
        t = self.tok
        if t.kind == "end":
            raise S.GuardSyntaxError("guard ends too early (unclosed bracket or missing operand)", len(self.text))
        extra = ""
        if t.text == "*" and "**" in self.text[max(0, t.start - 1): t.start + 2]:
            extra = " ('**' is not part of the guard language)"
        elif t.text == "(" and self.text[: t.start].rstrip()[-1:].isalnum():
            extra = " (only len, min, max, abs, all, any, range and is_tensor can be called; there are no methods)"
        raise S.GuardSyntaxError(f"unexpected {t.text!r}{extra}", t.start)

    def expect(self, text: str) -> _Tok:
        if not self.tok.is_(text):
            self.unexpected()
        return self.advance()

    def node(self, cls, *args):
        self.count += 1
        if self.count > S.MAX_NODES:
            raise S.GuardSyntaxError(f"guard has more than {S.MAX_NODES} parts; split it into several guards", 0)
        return cls(*args)

    def enter(self):
        self.depth += 1
        if self.depth > S.MAX_TREE_DEPTH:
            raise S.GuardSyntaxError(
                f"expression nested deeper than {S.MAX_TREE_DEPTH} levels; simplify the guard", self.tok.start)

    def name(self, tok: _Tok) -> str:
        if tok.text.startswith("_"):
            raise S.GuardSyntaxError(
                f"name {tok.text!r} refused: names starting with '_' (private or dunder access) are not part of "
                "the guard language", tok.start)
        return tok.text

    # expr: or_test ["if" or_test "else" expr]
    def expr(self) -> S.Node:
        self.enter()
        try:
            body = self.or_test()
            if self.tok.is_("if"):
                self.advance()
                test = self.or_test()
                self.expect("else")
                orelse = self.expr()
                return self.node(S.IfElse, self.lo(body), self.hi(orelse), body, test, orelse)
            return body
        finally:
            self.depth -= 1

    def _boolop(self, op: str, sub) -> S.Node:
        first = sub()
        if not self.tok.is_(op):
            return first
        values = [first]
        while self.tok.is_(op):
            self.advance()
            self.enter()
            values.append(sub())
        last = values[-1]
        self.depth -= len(values) - 1
        return self.node(S.BoolOp, self.lo(first), self.hi(last), op, tuple(values))

    def or_test(self) -> S.Node:
        return self._boolop("or", self.and_test)

    def and_test(self) -> S.Node:
        return self._boolop("and", self.not_test)

    def not_test(self) -> S.Node:
        if self.tok.is_("not"):
            start = self.advance().start
            self.enter()
            try:
                operand = self.not_test()
            finally:
                self.depth -= 1
            return self.node(S.Not, start, self.hi(operand), operand)
        return self.comparison()

    def comp_op(self) -> str | None:
        t = self.tok
        if t.kind == "op" and t.text in _COMPARE:
            self.advance()
            return t.text
        if t.is_("in"):
            self.advance()
            return "in"
        if t.is_("not") and self.peek().is_("in"):
            self.advance()
            self.advance()
            return "not in"
        return None

    def comparison(self) -> S.Node:
        left = self.arith()
        ops, comps = [], []
        while True:
            op = self.comp_op()
            if op is None:
                break
            ops.append(op)
            comps.append(self.arith())
        if not ops:
            return left
        return self.node(S.Compare, self.lo(left), self.hi(comps[-1]), left, tuple(ops), tuple(comps))

    def _binary(self, ops: tuple[str, ...], sub) -> S.Node:
        left = sub()
        steps = 0
        while self.tok.kind == "op" and self.tok.text in ops:
            op = self.advance().text
            self.enter()
            steps += 1
            right = sub()
            left = self.node(S.BinOp, self.lo(left), self.hi(right), op, left, right)
        self.depth -= steps
        return left

    def arith(self) -> S.Node:
        return self._binary(("+", "-"), self.term)

    def term(self) -> S.Node:
        return self._binary(("*", "/", "//", "%"), self.factor)

    def factor(self) -> S.Node:
        if self.tok.is_("-"):
            start = self.advance().start
            self.enter()
            try:
                inner = self.factor()
            finally:
                self.depth -= 1
            if isinstance(inner, S.Const) and isinstance(inner.value, (int, float)) and not isinstance(inner.value, bool):
                return self.node(S.Const, start, self.hi(inner), -inner.value)
            return self.node(S.Neg, start, self.hi(inner), inner)
        return self.postfix()

    def postfix(self) -> S.Node:
        node = self.atom()
        steps = 0
        while True:
            t = self.tok
            if t.is_("."):
                self.advance()
                nt = self.tok
                if nt.kind != "name":
                    self.unexpected()
                self.advance()
                node = self.node(S.Attr, self.lo(node), nt.end, node, self.name(nt))
            elif t.is_("["):
                self.advance()
                self.enter()
                steps += 1
                lower = None if self.tok.is_(":") else self.expr()
                if self.tok.is_(":"):
                    self.advance()
                    upper = None if self.tok.is_("]") else self.expr()
                    end = self.expect("]").end
                    node = self.node(S.Slice, self.lo(node), end, node, lower, upper)
                else:
                    end = self.expect("]").end
                    node = self.node(S.Index, self.lo(node), end, node, lower)
            else:
                break
        self.depth -= steps
        return node

    def _items_or_comprehension(self, close: str):
        """After '(' or '[': ([], None) | ([e, ...], None) | ([elt], (var_tok, iter))."""
        if self.tok.is_(close):
            return [], None
        first = self.expr()
        if self.tok.is_("for"):
            self.advance()
            var = self.tok
            if var.kind != "name":
                self.unexpected()
            self.advance()
            self.expect("in")
            it = self.or_test()
            return [first], (var, it)
        items = [first]
        while self.tok.is_(","):
            self.advance()
            items.append(self.expr())
        return items, None

    def atom(self) -> S.Node:
        t = self.tok
        if t.kind in ("int", "float"):
            self.advance()
            return self.node(S.number, t.text, t.start, t.end, t.kind == "float")
        if t.kind == "string":
            self.advance()
            return self.node(S.Const, t.start, t.end, t.text[1:-1])
        if t.kind == "name":
            self.advance()
            if self.tok.is_("("):
                func = self.name(t)
                self.advance()
                self.enter()
                try:
                    items, comp = self._items_or_comprehension(")")
                finally:
                    self.depth -= 1
                end = self.expect(")").end
                if comp is not None:
                    return self.node(S.Comprehension, t.start, end, func, items[0], self.name(comp[0]), comp[1])
                return self.node(S.Call, t.start, end, func, tuple(items))
            if t.text in S.CONSTANTS:
                return self.node(S.Const, t.start, t.end, S.CONSTANTS[t.text])
            return self.node(S.Name, t.start, t.end, self.name(t))
        if t.is_("["):
            self.advance()
            self.enter()
            try:
                items, comp = self._items_or_comprehension("]")
            finally:
                self.depth -= 1
            end = self.expect("]").end
            if comp is not None:
                return self.node(S.ListComp, t.start, end, items[0], self.name(comp[0]), comp[1])
            return self.node(S.ListLit, t.start, end, tuple(items))
        if t.is_("("):
            self.advance()
            self.enter()
            try:
                inner = self.expr()
            finally:
                self.depth -= 1
            end = self.expect(")").end
            self.extent[id(inner)] = (t.start, end, inner)
            return inner
        self.unexpected()
