"""Checked rule packs: rules and fusions with their guards parsed, ready to match.

Built only by :mod:`torchfl.rules.compile` from a validated file; frozen, so the registry
can hash and store them. ``canonical()`` is the validated document in canonical form
(every field, defaults filled, aliases as written in files) and what ``content_hash``
covers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from torchfl.rules.call import Call, TensorMeta
from torchfl.rules.format import Requires
from torchfl.rules.guards import Guard
from torchfl.rules.guards.types import Type, arg_type, list_of


@dataclass(frozen=True)
class CheckedGuard:
    text: str
    guard: Guard
    reason: str
    line: int
    column: int


@dataclass(frozen=True)
class Binding:
    """One kernel input/attr and the expression (or constant) that gives it."""

    name: str
    expr: Guard | None
    constant: Any = None

    def value(self, env):
        return self.constant if self.expr is None else self.expr.value(env)


@dataclass(frozen=True)
class OpEntry:
    """What a rule and a decomposition share: the op they serve, its declared arguments and
    how a call's arguments bind to them, the HCD requirements and guards, where it was written."""

    pack: str
    index: int
    op: str
    args: tuple[tuple[str, str], ...]
    primary: str | None
    requires: Requires
    guards: tuple[CheckedGuard, ...]
    defaults: tuple[tuple[str, Any], ...]
    note: str
    line: int

    def arg_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.args)

    def bind_args(self, call: Call) -> tuple[dict, str | None]:
        """name -> value of the call's arguments (defaults filled), or an error sentence."""
        names = self.arg_names()
        if len(call.args) > len(names):
            return {}, (f"the call has {len(call.args)} positional arguments but {self.id} declares "
                        f"{len(names)} ({', '.join(names)})")
        values = dict(zip(names, call.args))
        for k, v in call.kwargs.items():
            if k not in names:
                return {}, f"the call passes {k}=, which {self.id} does not declare (args: {', '.join(names)})"
            values[k] = v
        defaults = dict(self.defaults)
        for name, spelling in self.args:
            if name not in values:
                if name in defaults:
                    values[name] = defaults[name]
                elif spelling.endswith("?"):
                    values[name] = None
        return values, None

    def primary_value(self, values: Mapping[str, Any]):
        return values.get(self.primary) if self.primary else None


@dataclass(frozen=True)
class Rule(OpEntry):
    """An op served by one kernel, its inputs and attributes bound from the call (``bind``)."""

    kernel: str
    bind: tuple[Binding, ...]

    @property
    def id(self) -> str:
        """How messages name this rule: ``core:rules[3] aten.convolution.default -> conv2d``."""
        return f"{self.pack}:rules[{self.index}] {self.op} -> {self.kernel}"


def rule_scope(args: tuple[tuple[str, str], ...], chip_type: Type) -> dict[str, Type]:
    """Static types of the names a rule's guards and binds may use."""
    from torchfl.rules.guards.types import ANY, INT, STR, optional

    scope: dict[str, Type] = {
        "shape": list_of(INT), "rank": INT, "dtype": STR, "layout": optional(STR),
        "compute_dtype": STR, "compute_layout": optional(STR), "out": ANY, "chip": chip_type,
    }
    for name, spelling in args:
        scope[name] = arg_type(spelling) or ANY
    return scope


def call_env(rule: Rule, values: Mapping[str, Any], call: Call, dtype: str | None, layout: str | None,
             chip: Mapping) -> dict:
    """The evaluation environment of one rule on one call (args shadow the builtins)."""
    prim = rule.primary_value(values)
    env: dict[str, Any] = {}
    if isinstance(prim, TensorMeta):
        env["shape"] = list(prim.shape)
        env["rank"] = len(prim.shape)
    env["dtype"] = env["compute_dtype"] = dtype
    env["layout"] = env["compute_layout"] = layout
    env["out"] = call.out
    env["chip"] = chip
    env.update(values)
    return env


@dataclass(frozen=True)
class FusionStep:
    id: str
    ops: tuple[str, ...]
    input: str | None  # arg of this step fed by the producer step
    from_: str | None  # producer step id (None for the first step)
    output: int
    commutative: tuple[str, ...]
    into: str | None = None  # consumer step id: this step feeds that step's arg ``input`` (DAG patterns)


@dataclass(frozen=True)
class Fusion:
    pack: str
    index: int
    name: str
    kernel: str
    steps: tuple[FusionStep, ...]
    through: tuple[str, ...]
    requires: Requires
    guards: tuple[CheckedGuard, ...]
    bind: tuple[Binding, ...]
    note: str
    line: int
    step_rules: tuple[tuple[str, Rule], ...] = field(default=())  # step id -> the rule giving its args
    same: tuple[tuple[tuple[str, str], ...], ...] = ()   # groups of (step id, arg) holding one value

    @property
    def id(self) -> str:
        return f"{self.pack}:fusions[{self.index}] {self.name} -> {self.kernel}"

    @property
    def pattern(self) -> tuple[tuple[str, ...], ...]:
        return tuple(s.ops for s in self.steps)

    def rule_for(self, step_id: str) -> Rule:
        return dict(self.step_rules)[step_id]


@dataclass(frozen=True)
class DecompositionPart:
    """One part: ``op`` applied to ``args``/``kwargs`` (Bindings over the op's args and the
    earlier parts); skipped, its value being its first argument's, unless ``when`` holds."""

    id: str
    op: str
    args: tuple[Binding, ...]
    kwargs: tuple[Binding, ...]
    when: Guard | None
    line: int


@dataclass(frozen=True)
class Decomposition(OpEntry):
    """An op served by a composition of other ops (``parts``, the last one its value)."""

    name: str
    parts: tuple[DecompositionPart, ...]

    @property
    def id(self) -> str:
        return f"{self.pack}:decompositions[{self.index}] {self.name}"


@dataclass(frozen=True)
class NoRuleEntry:
    op: str
    reason: str


@dataclass(frozen=True)
class RulePack:
    name: str
    version: str
    description: str
    rules: tuple[Rule, ...]
    fusions: tuple[Fusion, ...]
    no_rule: tuple[NoRuleEntry, ...]
    source_file: str
    _canonical: str = field(repr=False, default="{}")
    decompositions: tuple[Decomposition, ...] = ()

    def canonical(self) -> dict:
        return json.loads(self._canonical)

    def canonical_json(self) -> str:
        return self._canonical

    def content_hash(self) -> str:
        return hashlib.sha256(self._canonical.encode()).hexdigest()

    def rules_for(self, op: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.op == op)

    @property
    def ops(self) -> tuple[str, ...]:
        """Ops with at least one rule, in file order."""
        return tuple(dict.fromkeys(r.op for r in self.rules))

    def no_rule_reason(self, op: str) -> str | None:
        for e in self.no_rule:
            if e.op == op:
                return e.reason
        return None

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"
