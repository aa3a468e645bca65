"""The guard language: a small, safe expression language for conditions on op calls.

Grammar (``grammar.lark``), by precedence, lowest first::

    x if cond else y
    a or b    a and b    not a
    a == b  a != b  a < b  a <= b  a > b  a >= b  a in b  a not in b   (chains: 0 < x <= 8)
    a + b  a - b        a * b  a / b  a // b  a % b        -a
    x.field   x[i]   x[i:j]   f(args)   all(e for v in list)   any(e for v in list)
    [e for v in list]   literals: 1  2.5  'str'  "str"  [1, 2]  true false none (also True False None)

Functions: ``len``, ``min``, ``max``, ``abs``, ``sqrt``, ``all``, ``any``, ``range`` (at most 4096 values),
``is_tensor`` (an argument that may be a tensor or a Python number, as ATen allows). Names are a rule's call
arguments (declared in its ``args:``), ``shape``/``dtype``/``layout``/``rank`` (of the
primary input, with ``dtype``/``layout`` the candidate's), ``out`` (the result), and
``chip`` (:mod:`torchfl.rules.guards.chip`). Names starting with ``_`` are refused.

A :class:`Guard` is parsed and statically checked once, at pack import, and evaluated by
walking its tree; see ``syntax``, ``check`` and ``evaluate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from torchfl.rules.guards.check import GuardTypeError, check
from torchfl.rules.guards.evaluate import GuardEvalError, evaluate, explain_false, show
from torchfl.rules.guards.syntax import GuardSyntaxError, Node, parse
from torchfl.rules.guards.types import Type

__all__ = ["Guard", "GuardError", "GuardEvalError", "GuardSyntaxError", "GuardTypeError", "compile_guard", "show"]

GuardError = GuardSyntaxError  # base of syntax and type errors


@dataclass(frozen=True)
class Guard:
    """A parsed, checked guard. ``test(env)`` -> (holds, reason-if-not)."""

    text: str
    tree: Node
    type: Type

    def value(self, env: Mapping[str, Any]):
        return evaluate(self.tree, self.text, env)

    def test(self, env: Mapping[str, Any]) -> tuple[bool, str | None]:
        try:
            ok = bool(self.value(env))
        except GuardEvalError as exc:
            return False, f"cannot be evaluated on this call: {exc.message}"
        if ok:
            return True, None
        return False, explain_false(self.tree, self.text, env)


def compile_guard(text: str, scope: Mapping[str, Type], *, want_bool: bool = True) -> Guard:
    """Parse and check ``text``. Raises GuardSyntaxError / GuardTypeError (with ``.offset``)."""
    tree = parse(text)
    t = check(tree, scope, want_bool=want_bool)
    return Guard(text, tree, t)
