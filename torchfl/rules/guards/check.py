"""Static checking of a parsed guard against the names its rule makes available.

Finds, before anything runs: unknown names and fields (with the nearest spellings),
unknown functions, operators applied to the wrong kinds of value, comparisons that can
never hold (``dtype == 16``), ``in`` against a non-list, guards that are not
conditions at all, and guards whose evaluation could exceed the step budget (nested
comprehensions over long ranges) or build oversized values. What cannot be known statically (``any``) is checked again by the
evaluator, which then fails the guard with a reason instead of crashing.
"""

from __future__ import annotations

import difflib
from typing import Mapping

from torchfl.rules.guards import syntax as S
from torchfl.rules.guards.types import (ANY, BOOL, FLOAT, INT, NONE, STR, Type, compatible, list_of, numeric,
                                        strip, unify)

FUNCTIONS = ("len", "min", "max", "abs", "sqrt", "all", "any", "range", "is_tensor")


class GuardTypeError(S.GuardSyntaxError):
    """A guard that parses but cannot be right (unknown name, wrong kind of value)."""


class GuardBudgetError(S.GuardSyntaxError):
    """A guard whose evaluation could exceed the step budget or the language's size limits."""


def _near(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(close)}?" if close else ""


def check(node: S.Node, scope: Mapping[str, Type], *, want_bool: bool = True) -> Type:
    """Type of ``node`` in ``scope``; raises :class:`GuardTypeError` at the offending part."""
    t = _Checker(scope).type(node)
    if want_bool and strip(t).kind not in ("bool", "any"):
        raise GuardTypeError(
            f"a guard must be a condition (true or false), but this is {t}; compare it with something", node.start
        )
    check_cost(node)
    return t


#: At import, a list or string that comes from the call (``shape``, an ``int[]`` argument,
#: ``range(rank)``) is assumed to hold at most this many items: 4x the highest rank an HCD
#: may declare. A call beyond it is still bounded at plan time by the evaluator's budget.
CALL_LEN = 64


def check_cost(node: S.Node) -> int:
    """Upper bound of the steps evaluating ``node`` takes (the evaluator's accounting), with
    call-dependent lengths taken as :data:`CALL_LEN`. Raises :class:`GuardBudgetError` at the
    smallest part that exceeds the step budget, a range or a string size limit."""
    from torchfl.rules.guards.evaluate import MAX_RANGE, STEP_BUDGET

    def limit(steps: int, size: int, n: S.Node, string: bool = False) -> tuple[int, int]:
        if steps > STEP_BUDGET:
            raise GuardBudgetError(
                f"evaluating this could take {steps:,} steps; the budget is {STEP_BUDGET:,} (a list of up to "
                f"{CALL_LEN} items from the call, or a range, iterated inside another); iterate over less",
                n.start)
        if string and size > S.MAX_CHARS * 4:
            raise GuardBudgetError(f"this builds a string of up to {size:,} characters; the limit is "
                                   f"{S.MAX_CHARS * 4:,}", n.start)
        return steps, size

    def const_int(n: S.Node):
        return n.value if isinstance(n, S.Const) and isinstance(n.value, int) and not isinstance(n.value, bool) \
            else None

    def cost(n: S.Node) -> tuple[int, int]:  # noqa: C901 - one case per construct
        """(steps, length of the value if it is a list or string)."""
        if isinstance(n, S.Const):
            return 1, len(n.value) if isinstance(n.value, str) else 0
        if isinstance(n, (S.Name, S.Attr, S.Index)):
            inner = sum(cost(c)[0] for c in (getattr(n, "obj", None), getattr(n, "index", None)) if c is not None)
            return 1 + inner, CALL_LEN
        if isinstance(n, S.ListLit):
            return limit(1 + sum(cost(i)[0] for i in n.items), len(n.items), n)
        if isinstance(n, S.Slice):
            steps, size = cost(n.obj)
            steps += sum(cost(b)[0] for b in (n.lower, n.upper) if b is not None)
            return limit(1 + steps + size, size, n)
        if isinstance(n, (S.Neg, S.Not)):
            return 1 + cost(n.operand)[0], 0
        if isinstance(n, S.BoolOp):
            return limit(1 + sum(cost(v)[0] for v in n.values), 0, n)
        if isinstance(n, S.BinOp):
            (sa, la), (sb, lb) = cost(n.left), cost(n.right)
            if n.op == "+":
                return limit(1 + sa + sb + la + lb, la + lb, n, string=True)
            return limit(1 + sa + sb, 0, n)
        if isinstance(n, S.Compare):
            steps = 1 + cost(n.left)[0]
            for op, comp in zip(n.ops, n.comparators):
                cs, cl = cost(comp)
                steps += cs + (cl if op in ("in", "not in") else 0)
            return limit(steps, 0, n)
        if isinstance(n, S.IfElse):
            (st, _), (sb, lb), (so, lo) = cost(n.test), cost(n.body), cost(n.orelse)
            return limit(1 + st + max(sb, so), max(lb, lo), n)
        if isinstance(n, S.Call):
            parts = [cost(a) for a in n.args]
            steps = 1 + sum(p[0] for p in parts)
            if n.func == "range":
                bounds = [const_int(a) for a in n.args]
                if all(b is not None for b in bounds):
                    lo, hi = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
                    if hi - lo > MAX_RANGE:
                        raise GuardBudgetError(f"range of {hi - lo:,} values; the limit is {MAX_RANGE:,}", n.start)
                    size = max(0, hi - lo)
                else:
                    size = CALL_LEN
                return limit(steps + size, size, n)
            if n.func in ("min", "max", "all", "any"):
                steps += parts[0][1] if len(parts) == 1 else len(parts)
            return limit(steps, 0, n)
        if isinstance(n, (S.ListComp, S.Comprehension)):
            (si, li), (se, _) = cost(n.iter), cost(n.elt)
            return limit(1 + si + li * se, li, n)
        return 1, 0  # pragma: no cover - every construct is listed above

    return cost(node)[0]


class _Checker:
    def __init__(self, scope: Mapping[str, Type]):
        self.scopes = [dict(scope)]

    def lookup(self, node: S.Name) -> Type:
        for scope in reversed(self.scopes):
            if node.id in scope:
                return scope[node.id]
        names = {k for s in self.scopes for k in s}
        hint = _near(node.id, names) or (f"; known names: {', '.join(sorted(names))}" if len(names) <= 30 else "")
        if node.id in FUNCTIONS:
            hint = f"; {node.id} is a function: write {node.id}(...)"
        raise GuardTypeError(f"unknown name {node.id!r}{hint}", node.start)

    def type(self, n: S.Node) -> Type:
        """The static type of ``n``: one small method per construct (``_TYPERS``)."""
        typer = _TYPERS.get(type(n))
        if typer is None:  # pragma: no cover - every construct is listed
            raise GuardTypeError(f"unsupported construct {type(n).__name__}", n.start)
        return typer(self, n)

    def _const(self, n: S.Const) -> Type:
        v = n.value
        if v is None:
            return NONE
        if isinstance(v, bool):
            return BOOL
        if isinstance(v, int):
            return INT
        if isinstance(v, float):
            return FLOAT
        return STR

    def _list(self, n: S.ListLit) -> Type:
        return list_of(unify([self.type(i) for i in n.items]))

    def _attr(self, n: S.Attr) -> Type:
        base = strip(self.type(n.obj))
        if base.kind == "any":
            return ANY
        if base.kind != "record":
            raise GuardTypeError(f"{base} has no fields (.{n.name})", n.start)
        f = base.field(n.name)
        if f is None and base.name == "chip" and n.name in ("chip", "name", "vendor", "version", "device_type"):
            raise GuardTypeError(
                f"chip.{n.name}: a chip's identity is not visible to guards; rule packs are chip-agnostic "
                "(condition on capabilities, or restrict with requires.device_types)", n.obj.end)
        if f is None and base.name == "chip" and n.name in ("fp16", "bf16", "fp32", "int8", "attention"):
            raise GuardTypeError(f"chip has no field {n.name!r}; did you mean chip.compute_units.{n.name}?",
                                 n.obj.end)
        if f is None:
            raise GuardTypeError(
                f"{base.name} has no field {n.name!r}{_near(n.name, base.field_names)} "
                f"(fields: {', '.join(base.field_names)})",
                n.obj.end,
            )
        return f

    def _index(self, n: S.Index) -> Type:
        base, idx = strip(self.type(n.obj)), strip(self.type(n.index))
        if idx.kind not in ("int", "any"):
            raise GuardTypeError(f"an index must be an int, not {idx}", n.index.start)
        if base.kind == "list":
            return base.elem
        if base.kind in ("str", "any"):
            return base
        raise GuardTypeError(f"cannot index {base} (only lists and strings)", n.start)

    def _slice(self, n: S.Slice) -> Type:
        base = strip(self.type(n.obj))
        for part in (n.lower, n.upper):
            if part is not None and strip(self.type(part)).kind not in ("int", "any"):
                raise GuardTypeError("slice bounds must be ints", part.start)
        if base.kind in ("list", "str", "any"):
            return base
        raise GuardTypeError(f"cannot slice {base} (only lists and strings)", n.start)

    def _neg(self, n: S.Neg) -> Type:
        t = strip(self.type(n.operand))
        if not numeric(t):
            raise GuardTypeError(f"cannot negate {t}", n.start)
        return t if t.kind != "bool" else INT

    def _not(self, n: S.Not) -> Type:
        self.type(n.operand)
        return BOOL

    def _boolop(self, n: S.BoolOp) -> Type:
        for v in n.values:
            self.type(v)
        return BOOL

    def _ifelse(self, n: S.IfElse) -> Type:
        self.type(n.test)
        return unify([self.type(n.body), self.type(n.orelse)])

    def _bound(self, n, elt_type):
        """The type of ``n.elt`` with ``n.var`` bound to the elements of ``n.iter``."""
        it = strip(self.type(n.iter))
        if it.kind not in ("list", "any"):
            raise GuardTypeError(f"'for {n.var} in ...' needs a list, not {it}", n.iter.start)
        self.scopes.append({n.var: it.elem if it.kind == "list" else ANY})
        try:
            return elt_type(n.elt)
        finally:
            self.scopes.pop()

    def _listcomp(self, n: S.ListComp) -> Type:
        return list_of(self._bound(n, self.type))

    def _comprehension(self, n: S.Comprehension) -> Type:
        if n.func not in ("all", "any"):
            raise GuardTypeError(f"only all(... for x in ...) and any(...) take a 'for' clause, not {n.func}", n.start)
        self._bound(n, self.type)
        return BOOL

    def binop(self, n: S.BinOp) -> Type:
        a, b = strip(self.type(n.left)), strip(self.type(n.right))
        if "any" in (a.kind, b.kind):
            return ANY
        if numeric(a) and numeric(b):
            if n.op == "/" or "float" in (a.kind, b.kind):
                return FLOAT
            return INT
        if n.op == "+" and a.kind == b.kind and a.kind in ("str", "list"):
            return a if a.kind == "str" else list_of(unify([a.elem, b.elem]))
        raise GuardTypeError(f"cannot apply {n.op!r} to {a} and {b}", n.start)

    def compare(self, n: S.Compare) -> Type:
        left = self.type(n.left)
        for op, comp_node in zip(n.ops, n.comparators):
            right = self.type(comp_node)
            a, b = strip(left), strip(right)
            if op in ("in", "not in"):
                if b.kind == "str":
                    if a.kind not in ("str", "any"):
                        raise GuardTypeError(f"'{op}' a string needs a string on the left, not {a}", n.start)
                elif b.kind == "list":
                    if not compatible(a, b.elem):
                        raise GuardTypeError(f"{a} can never be in a {b}", n.start)
                elif b.kind not in ("any",):
                    raise GuardTypeError(f"'{op}' needs a list or string on the right, not {b}", comp_node.start)
            elif op in ("==", "!="):
                if not compatible(a, b):
                    raise GuardTypeError(f"comparing {a} with {b} is always {'false' if op == '==' else 'true'}", n.start)
            else:
                ok = (numeric(a) and numeric(b)) or (a.kind == b.kind == "str") or "any" in (a.kind, b.kind)
                if not ok:
                    raise GuardTypeError(f"cannot order {a} and {b} with {op!r}", n.start)
            left = right
        return BOOL

    def call(self, n: S.Call) -> Type:
        if n.func not in FUNCTIONS:
            raise GuardTypeError(
                f"unknown function {n.func!r}{_near(n.func, FUNCTIONS)} (functions: {', '.join(FUNCTIONS)})", n.start
            )
        args = [strip(self.type(a)) for a in n.args]
        if n.func == "len":
            if len(args) != 1:
                raise GuardTypeError("len takes one argument", n.start)
            if args[0].kind not in ("list", "str", "any") and not (args[0].kind == "record" and args[0].name == "tensor"):
                raise GuardTypeError(f"len needs a list, string or tensor, not {args[0]}", n.start)
            return INT
        if n.func == "is_tensor":
            if len(args) != 1:
                raise GuardTypeError("is_tensor takes one argument", n.start)
            return BOOL
        if n.func == "range":
            if not 1 <= len(args) <= 2 or not all(strip(a).kind in ("int", "any") for a in args):
                raise GuardTypeError("range takes one or two ints: range(n), range(a, b)", n.start)
            return list_of(INT)
        if n.func == "abs":
            if len(args) != 1 or not numeric(args[0]):
                raise GuardTypeError("abs takes one number", n.start)
            return args[0]
        if n.func == "sqrt":
            if len(args) != 1 or not numeric(args[0]):
                raise GuardTypeError("sqrt takes one number", n.start)
            return FLOAT
        if n.func in ("min", "max"):
            if not args:
                raise GuardTypeError(f"{n.func} needs arguments", n.start)
            items = args
            if len(args) == 1:
                if args[0].kind not in ("list", "any"):
                    raise GuardTypeError(f"{n.func} of one argument needs a list, not {args[0]}", n.start)
                items = [args[0].elem] if args[0].kind == "list" else [ANY]
            for t in items:
                if not numeric(t) and t.kind not in ("str", "any"):
                    raise GuardTypeError(f"{n.func} needs numbers, not {t}", n.start)
            return unify(items)
        # all / any over a list
        if len(args) != 1 or args[0].kind not in ("list", "any"):
            raise GuardTypeError(f"{n.func} takes one list, or a form like {n.func}(x > 0 for x in shape)", n.start)
        return BOOL


_TYPERS = {S.Const: _Checker._const, S.Name: _Checker.lookup, S.ListLit: _Checker._list, S.Attr: _Checker._attr,
           S.Index: _Checker._index, S.Slice: _Checker._slice, S.Neg: _Checker._neg, S.Not: _Checker._not,
           S.BoolOp: _Checker._boolop, S.BinOp: _Checker.binop, S.Compare: _Checker.compare,
           S.Call: _Checker.call, S.IfElse: _Checker._ifelse, S.ListComp: _Checker._listcomp,
           S.Comprehension: _Checker._comprehension}
