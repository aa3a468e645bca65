"""Evaluate a guard by walking its tree, with a step budget; explain why one is false.

Values are plain Python data (int, float, bool, str, None, lists/tuples), tensor
metadata (:class:`torchfl.rules.call.TensorMeta`, whose few fields are read by name from a
fixed list) and dicts (the ``chip`` namespace, read by key). No attribute of any Python
object is ever looked up by a name taken from the guard. Every step costs one unit of a
budget, and integers are bounded, so a guard's cost is bounded whatever the call holds.
"""

from __future__ import annotations

import math

from typing import Any, Mapping

from torchfl.rules.guards import syntax as S

STEP_BUDGET = 20_000
MAX_RANGE = 4096


class GuardEvalError(Exception):
    """A guard that could not be evaluated on this call (absent value, wrong type, budget)."""

    def __init__(self, message: str, node: S.Node | None = None):
        super().__init__(message)
        self.message = message
        self.node = node


def _tensor_field(value, name: str):
    from torchfl.rules.call import TensorMeta

    if isinstance(value, TensorMeta) and name in TensorMeta.FIELDS:
        return value.field(name)
    return _MISSING


_MISSING = object()


def _kind(v) -> str:
    from torchfl.rules.call import TensorMeta

    if v is None:
        return "none"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "str"
    if isinstance(v, (list, tuple)):
        return "list"
    if isinstance(v, TensorMeta):
        return "tensor"
    if isinstance(v, Mapping):
        return "record"
    return type(v).__name__


def show(v) -> str:
    """A value as a guard would write it."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return repr(v) if not v.isidentifier() else v
    if isinstance(v, (list, tuple)):
        inner = ", ".join(show(x) for x in v[:16])
        return f"[{inner}{', ...' if len(v) > 16 else ''}]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(str(k) for k in list(v)[:8]) + "}"
    return str(v)


class Evaluator:
    def __init__(self, text: str, env: Mapping[str, Any], budget: int = STEP_BUDGET):
        self.text = text
        self.scopes = [env]
        self.budget = budget

    def src(self, n: S.Node) -> str:
        return S.source(self.text, n)

    def fail(self, message: str, n: S.Node):
        raise GuardEvalError(message, n)

    def lookup(self, n: S.Name):
        for scope in reversed(self.scopes):
            if n.id in scope:
                return scope[n.id]
        self.fail(f"{n.id} is not available on this call", n)

    def value(self, n: S.Node):
        """The value of ``n`` in this environment: one small method per construct (``_VALUES``),
        each step paid from the budget."""
        self.budget -= 1
        if self.budget < 0:
            self.fail("guard exceeded its evaluation budget", n)
        method = _VALUES.get(type(n))
        if method is None:  # pragma: no cover - every construct is listed
            self.fail(f"unsupported construct {type(n).__name__}", n)
        return method(self, n)

    def _const(self, n: S.Const):
        return n.value

    def _list(self, n: S.ListLit):
        return [self.value(i) for i in n.items]

    def _attr(self, n: S.Attr):
        obj = self.value(n.obj)
        if obj is None:
            self.fail(f"{self.src(n.obj)} is absent (none), so .{n.name} cannot be read", n)
        if isinstance(obj, Mapping):
            if n.name not in obj:
                self.fail(f"{self.src(n)} is absent on this chip", n)
            return obj[n.name]
        got = _tensor_field(obj, n.name)
        if got is _MISSING:
            self.fail(f"{self.src(n.obj)} ({_kind(obj)}) has no field {n.name}", n)
        return got

    def _index(self, n: S.Index):
        obj, idx = self.value(n.obj), self.value(n.index)
        if not isinstance(obj, (list, tuple, str)) or not isinstance(idx, int) or isinstance(idx, bool):
            self.fail(f"cannot index {_kind(obj)} {self.src(n.obj)} with {show(idx)}", n)
        if not -len(obj) <= idx < len(obj):
            self.fail(f"index {idx} out of range for {self.src(n.obj)} = {show(obj)}", n)
        return obj[idx]

    def _slice(self, n: S.Slice):
        obj = self.value(n.obj)
        lo = None if n.lower is None else self.value(n.lower)
        hi = None if n.upper is None else self.value(n.upper)
        if not isinstance(obj, (list, tuple, str)) or not all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in (lo, hi)):
            self.fail(f"cannot slice {_kind(obj)} {self.src(n.obj)}", n)
        out = obj[lo:hi]
        self.budget -= len(out)
        return list(out) if isinstance(out, tuple) else out

    def _neg(self, n: S.Neg):
        v = self.value(n.operand)
        self._need_number(v, n.operand)
        return -v

    def _not(self, n: S.Not):
        return not self.truth(self.value(n.operand), n.operand)

    def _boolop(self, n: S.BoolOp):
        stop = n.op != "and"  # and: stops at the first false part; or: at the first true one
        for v in n.values:
            if self.truth(self.value(v), v) == stop:
                return stop
        return not stop

    def _compare_chain(self, n: S.Compare):
        left = self.value(n.left)
        for op, comp in zip(n.ops, n.comparators):
            right = self.value(comp)
            if not self.compare(op, left, right, n):
                return False
            left = right
        return True

    def _ifelse(self, n: S.IfElse):
        return self.value(n.body) if self.truth(self.value(n.test), n.test) else self.value(n.orelse)

    def _for_each(self, n, step):
        """``step(item)`` for each element of ``n.iter``, bound to ``n.var``; stops at the first
        non-None result and returns it."""
        seq = self.value(n.iter)
        if not isinstance(seq, (list, tuple)):
            self.fail(f"{self.src(n.iter)} is {_kind(seq)}, not a list", n.iter)
        self.scopes.append({})
        try:
            for item in seq:
                self.scopes[-1][n.var] = item
                result = step()
                if result is not None:
                    return result
        finally:
            self.scopes.pop()
        return None

    def _listcomp(self, n: S.ListComp):
        out = []
        self._for_each(n, lambda: out.append(self.value(n.elt)))
        return out

    def _comprehension(self, n: S.Comprehension):
        want = n.func == "all"
        stop = self._for_each(n, lambda: True if self.truth(self.value(n.elt), n.elt) != want else None)
        return (not want) if stop else want

    def truth(self, v, n: S.Node) -> bool:
        if isinstance(v, (bool, int, float, str, list, tuple)) or v is None:
            return bool(v)
        self.fail(f"{self.src(n)} ({_kind(v)}) is not a condition", n)

    def _need_number(self, v, n: S.Node):
        if not isinstance(v, (int, float)):
            self.fail(f"{self.src(n)} is {_kind(v)} {show(v)}, not a number", n)

    def _bounded(self, v, n: S.Node):
        if isinstance(v, int) and abs(v) > S.MAX_INT:
            self.fail("number out of range", n)
        if isinstance(v, float) and v != v:
            self.fail("result is not a number (NaN)", n)
        return v

    def binop(self, n: S.BinOp):
        a, b = self.value(n.left), self.value(n.right)
        if n.op == "+" and isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            self.budget -= len(a) + len(b)
            if self.budget < 0:
                self.fail("guard exceeded its evaluation budget", n)
            return list(a) + list(b)
        if n.op == "+" and isinstance(a, str) and isinstance(b, str):
            if len(a) + len(b) > S.MAX_CHARS * 4:
                self.fail("string too long", n)
            return a + b
        self._need_number(a, n.left)
        self._need_number(b, n.right)
        try:
            if n.op == "+":
                return self._bounded(a + b, n)
            if n.op == "-":
                return self._bounded(a - b, n)
            if n.op == "*":
                return self._bounded(a * b, n)
            if n.op == "/":
                return self._bounded(a / b, n)
            if n.op == "//":
                return self._bounded(a // b, n)
            if n.op == "%":
                return self._bounded(a % b, n)
        except ZeroDivisionError:
            self.fail(f"division by zero in {self.src(n)}", n)
        except OverflowError:
            self.fail("number out of range", n)
        self.fail(f"unknown operator {n.op}", n)  # pragma: no cover

    def compare(self, op: str, a, b, n: S.Node) -> bool:
        if op in ("in", "not in"):
            if isinstance(b, str):
                if not isinstance(a, str):
                    self.fail(f"'{op}' a string needs a string on the left, got {show(a)}", n)
                found = a in b
            elif isinstance(b, (list, tuple)):
                self.budget -= len(b)
                found = any(_equal(a, x) for x in b)
            else:
                self.fail(f"'{op}' needs a list on the right, got {_kind(b)} {show(b)}", n)
            return found if op == "in" else not found
        if op == "==":
            return _equal(a, b)
        if op == "!=":
            return not _equal(a, b)
        ok = (isinstance(a, (int, float)) and isinstance(b, (int, float))) or (isinstance(a, str) and isinstance(b, str))
        if not ok:
            self.fail(f"cannot order {show(a)} and {show(b)} with {op}", n)
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]

    def call(self, n: S.Call):
        args = [self.value(a) for a in n.args]
        f = n.func
        if f == "len":
            from torchfl.rules.call import TensorMeta

            v = args[0]
            if isinstance(v, TensorMeta):
                return len(v.shape)
            if not isinstance(v, (list, tuple, str)):
                self.fail(f"len of {_kind(v)} {self.src(n.args[0])}", n)
            return len(v)
        if f == "is_tensor":
            from torchfl.rules.call import TensorMeta

            return isinstance(args[0], TensorMeta)
        if f == "range":
            if not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
                self.fail(f"range needs ints, got {show(args)}", n)
            lo, hi = (0, args[0]) if len(args) == 1 else (args[0], args[1])
            if hi - lo > MAX_RANGE:
                self.fail(f"range of {hi - lo} values; the limit is {MAX_RANGE}", n)
            self.budget -= max(0, hi - lo)
            if self.budget < 0:
                self.fail("guard exceeded its evaluation budget", n)
            return list(range(lo, hi))
        if f == "abs":
            self._need_number(args[0], n.args[0])
            return abs(args[0])
        if f == "sqrt":   # attention's default scale 1/sqrt(head_dim), in decompositions
            self._need_number(args[0], n.args[0])
            if args[0] < 0:
                self.fail(f"sqrt of a negative number {show(args[0])}", n)
            return math.sqrt(args[0])
        if f in ("min", "max"):
            items = args[0] if len(args) == 1 else args
            if not isinstance(items, (list, tuple)) or not items:
                self.fail(f"{f} of an empty or non-list value", n)
            kinds = {_kind(x) for x in items}
            if not (kinds <= {"number", "bool"} or kinds == {"str"}):
                self.fail(f"{f} needs numbers, got {show(items)}", n)
            self.budget -= len(items)
            return min(items) if f == "min" else max(items)
        if f in ("all", "any"):
            seq = args[0]
            if not isinstance(seq, (list, tuple)):
                self.fail(f"{f} needs a list, got {_kind(seq)}", n)
            self.budget -= len(seq)
            truths = [self.truth(x, n) for x in seq]
            return all(truths) if f == "all" else any(truths)
        self.fail(f"unknown function {f}", n)  # pragma: no cover - refused statically


_VALUES = {S.Const: Evaluator._const, S.Name: Evaluator.lookup, S.ListLit: Evaluator._list,
           S.Attr: Evaluator._attr, S.Index: Evaluator._index, S.Slice: Evaluator._slice, S.Neg: Evaluator._neg,
           S.Not: Evaluator._not, S.BoolOp: Evaluator._boolop, S.BinOp: Evaluator.binop,
           S.Compare: Evaluator._compare_chain, S.Call: Evaluator.call, S.IfElse: Evaluator._ifelse,
           S.ListComp: Evaluator._listcomp, S.Comprehension: Evaluator._comprehension}


def _equal(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return False
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return a is b
    return a == b


def evaluate(node: S.Node, text: str, env: Mapping[str, Any], budget: int = STEP_BUDGET):
    """Value of a parsed guard in ``env``. Raises :class:`GuardEvalError`."""
    return Evaluator(text, env, budget).value(node)


def explain_false(node: S.Node, text: str, env: Mapping[str, Any]) -> str:
    """Why a guard is false, naming the failing part and the values it saw."""
    ev = Evaluator(text, env)
    try:
        return _explain(ev, node)
    except GuardEvalError as exc:
        return exc.message


def _operands(ev: Evaluator, nodes) -> str:
    parts = []
    for part in nodes:
        items = part.items if isinstance(part, S.ListLit) else ()
        if isinstance(part, (S.Const, S.ListLit)) and all(isinstance(i, S.Const) for i in items):
            continue
        try:
            parts.append(f"{ev.src(part)} = {show(ev.value(part))}")
        except GuardEvalError as exc:
            parts.append(exc.message)
    return f" ({'; '.join(parts)})" if parts else ""


def _explain(ev: Evaluator, n: S.Node) -> str:
    if isinstance(n, S.BoolOp) and n.op == "and":
        for v in n.values:
            if not ev.truth(ev.value(v), v):
                return _explain(ev, v)
    if isinstance(n, S.BoolOp) and n.op == "or":
        return " and ".join(_explain(ev, v) for v in n.values)
    if isinstance(n, S.Compare):
        left = n.left
        for op, comp in zip(n.ops, n.comparators):
            if not ev.compare(op, ev.value(left), ev.value(comp), n):
                return f"{ev.src(left)} {op} {ev.src(comp)} is false{_operands(ev, (left, comp))}"
            left = comp
    if isinstance(n, S.Comprehension):
        seq = ev.value(n.iter)
        want = n.func == "all"
        if want:
            ev.scopes.append({})
            for item in seq:
                ev.scopes[-1][n.var] = item
                if not ev.truth(ev.value(n.elt), n.elt):
                    return f"{ev.src(n.elt)} is false for {n.var} = {show(item)} ({ev.src(n.iter)} = {show(seq)})"
        return f"{ev.src(n)} is false ({ev.src(n.iter)} = {show(seq)})"
    return f"{ev.src(n)} is false{_operands(ev, [n] if not isinstance(n, S.Not) else [n.operand])}"
