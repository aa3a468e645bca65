"""Matching rules against a chip (HCD) and an op call: which kernel serves it, or why not.

Everything is decided from the HCD's numbers and capabilities (listed dtypes, the unit
that runs a dtype, that unit's layouts, the attention unit, constraints) and from the
rule's guards on the call; never from a chip's name. Each reason names the HCD field and
its value on this chip, or the rule and the guard that excluded the call, so that the
planner's errors and ``registry why-not`` can quote them as they are.

- ``candidates(packs, hcd, op, call)``: one :class:`Match` or :class:`Rejection` per rule.
- ``match(packs, hcd, op, call)``: the first match, else a rejection with every reason.
- ``match_fusion(fusion, hcd, calls, swaps=group.swaps)``: the same for a fusion group
  (one call per step); :mod:`torchfl.rules.groups` finds the groups in a graph.
- ``call=None`` asks about the chip alone (what the support queries show): requirements
  are checked, guards on the call are listed as pending, guards on ``chip`` alone are
  evaluated.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping

from torchfl.hcd.dtypes import MATRIX_UNITS, STORAGE, unit_label
from torchfl.rules import kernels as K
from torchfl.rules.call import Call, TensorMeta
from torchfl.rules.guards import GuardEvalError
from torchfl.rules.guards import syntax as S
from torchfl.rules.guards.chip import chip_view
from torchfl.rules.guards.evaluate import show
from torchfl.rules.groups import oriented
from torchfl.rules.pack import Fusion, Rule, RulePack, call_env

ALL_DTYPES = tuple(STORAGE)          # every dtype the emulated chip can store
UNIT_NAMES = MATRIX_UNITS
CHIP_ONLY = {"chip", "dtype", "layout", "compute_dtype", "compute_layout"}


@dataclass(frozen=True)
class Reason:
    """One reason a rule does not serve a call. ``field``/``value``: the HCD fact; ``rule``/``guard``: the rule's."""

    code: str  # no_rule | device_type | dtype | unit | attention | layout | guard | args | bind
    message: str
    field: str | None = None
    value: Any = None
    rule: str | None = None
    guard: str | None = None

    def __str__(self) -> str:
        return self.message

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Match:
    """A rule (or fusion) that serves the call: the kernel, dtype/unit/layout, bound inputs and attrs."""

    op: str
    kernel: str
    rule: Rule | Fusion = field(repr=False)
    pack: str
    dtype: str | None
    unit: str | None
    layout: str | None
    layouts: tuple[str, ...]  # every layout this kernel may run in on this chip ((): layout does not apply)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    attrs: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    pending_guards: tuple[str, ...] = ()  # guards on the call not evaluated (call=None)
    ok: bool = True

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True)
class Rejection:
    op: str
    reasons: tuple[Reason, ...]
    rule: Rule | Fusion | None = None
    ok: bool = False

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return "; ".join(r.message for r in self.reasons)


def chip_label(hcd) -> str:
    return f"{hcd.chip.name} {hcd.chip.version}"


_VIEWS: dict[int, tuple[Any, dict]] = {}


def _view(hcd) -> dict:
    hit = _VIEWS.get(id(hcd))
    if hit is not None and hit[0] is hcd:
        return hit[1]
    if len(_VIEWS) > 64:
        _VIEWS.clear()
    view = chip_view(hcd)
    _VIEWS[id(hcd)] = (hcd, view)
    return view


def _packs(packs) -> tuple[RulePack, ...]:
    if isinstance(packs, RulePack):
        return (packs,)
    return tuple(packs)


def _fmt(values) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _present_units(hcd) -> list[str]:
    return [u for u in (*UNIT_NAMES, "attention") if getattr(hcd.compute_units, u) is not None]


# -- HCD requirements ------------------------------------------------------------------

def rule_dtypes(rule: Rule | Fusion) -> tuple[str, ...]:
    """dtypes a rule computes in: its requires.dtypes, else its kernel's, else all."""
    if rule.requires.dtypes:
        return tuple(rule.requires.dtypes)
    return K.kernel_dtypes(rule.kernel) or ALL_DTYPES


INDEX_DTYPES = ("int32", "int64", "bool")


def chip_stores(hcd, dtype: str) -> bool:
    return dtype in hcd.stored_dtypes


def requirements(rule: Rule | Fusion, hcd, dtype: str | None, layout: str | None):
    """(reasons, unit, allowed layouts, warnings) of a rule on a chip for one dtype/layout."""
    req, label, reasons, warnings = rule.requires, chip_label(hcd), [], []
    unit = None
    if req.device_types and hcd.chip.device_type not in req.device_types:
        reasons.append(Reason("device_type", f"chip.device_type {hcd.chip.device_type} of {label} is not in "
                              f"{_fmt(req.device_types)}, the device types {rule.id} is restricted to",
                              "chip.device_type", hcd.chip.device_type, rule.id))
    if dtype is not None:
        served = rule_dtypes(rule)
        if dtype not in served:
            reasons.append(Reason("dtype", f"{rule.id} computes in {_fmt(served)}, not {dtype}", rule=rule.id))
        elif req.storage and req.index and dtype in INDEX_DTYPES and not chip_stores(hcd, dtype):
            warnings.append(f"{dtype} index math and masks run on the index path of {label} "
                            f"(tensor.supported_dtypes lists no {dtype})")
        elif req.storage and not chip_stores(hcd, dtype):
            listed = list(hcd.tensor.supported_dtypes)
            reasons.append(Reason("dtype", f"dtype {dtype} not in tensor.supported_dtypes {_fmt(listed)} of {label}",
                                  "tensor.supported_dtypes", listed))
        elif req.compute:
            unit = hcd.unit_for(dtype)
            if unit is None:
                reasons.append(Reason("unit", f"no compute unit runs {dtype}: compute_units has "
                                      f"{_fmt(u for u in _present_units(hcd) if u != 'attention')} on {label}",
                                      f"compute_units.{unit_label(dtype)}", None))
            elif dtype == "bfloat16" and unit == "fp16":
                why = ("constraints.bfloat16_emulation is true" if hcd.constraints.bfloat16_emulation
                       else "no bf16 unit")
                warnings.append(f"bfloat16 runs on compute_units.fp16 of {label} ({why}), rated at its peak")
    for u in req.units or ():
        if getattr(hcd.compute_units, u) is None:
            reasons.append(Reason("unit", f"compute_units.{u} is absent on {label} (required by {rule.id})",
                                  f"compute_units.{u}", None, rule.id))
    if req.attention:
        att = hcd.compute_units.attention
        if att is None:
            reasons.append(Reason("attention", f"compute_units.attention is absent on {label}",
                                  "compute_units.attention", None, rule.id))
        elif not att.enabled:
            reasons.append(Reason("attention", f"compute_units.attention.enabled is false on {label}",
                                  "compute_units.attention.enabled", False, rule.id))
    allowed, field_name, describe = _allowed_layouts(rule, hcd, unit)
    if layout is not None and req.layouts != "none" and layout not in allowed:
        where = f"{describe} {_fmt(allowed)}" if "(" not in describe else describe.replace(" (", f" {_fmt(allowed)} (", 1)
        reasons.append(Reason("layout", f"layout {layout} not in {where} of {label}",
                              field_name, list(allowed), rule.id if isinstance(req.layouts, list) else None))
    return reasons, unit, allowed, warnings


def _allowed_layouts(rule, hcd, unit):
    mode = rule.requires.layouts
    if mode == "none":
        return (), None, "layouts"
    if mode == "chip" or unit is None:
        return tuple(hcd.layouts), "layouts", "the layouts the chip computes in"
    own = getattr(hcd.compute_units, unit).supported_layouts
    base = tuple(hcd.unit_layouts(unit))
    fieldname = f"compute_units.{unit}.supported_layouts"
    describe = fieldname if own else f"the chip's layouts (compute_units.{unit} lists no supported_layouts)"
    if isinstance(mode, list):
        return tuple(x for x in base if x in mode), fieldname, f"{describe} ∩ {rule.id} layouts {_fmt(mode)} ="
    return base, fieldname, describe


# -- single ops ------------------------------------------------------------------------

def candidates(packs, hcd, op: str, call: Call | None = None, *, dtype: str | None = None,
               layout: str | None = None) -> list[Match | Rejection]:
    """One outcome per rule for ``op`` in ``packs`` (in pack and file order)."""
    out: list[Match | Rejection] = []
    for pack in _packs(packs):
        for rule in pack.rules_for(op):
            out.append(_match_rule(pack, rule, hcd, op, call, dtype, layout))
    return out


def match(packs, hcd, op: str, call: Call | None = None, *, dtype: str | None = None,
          layout: str | None = None) -> Match | Rejection:
    """The first rule that serves ``op`` on ``hcd`` for ``call``, else every reason why none does."""
    results = candidates(packs, hcd, op, call, dtype=dtype, layout=layout)
    for r in results:
        if r.ok:
            return r
    if not results:
        return Rejection(op, (no_rule_reason(packs, op),))
    return Rejection(op, tuple(reason for r in results for reason in r.reasons))


def _op_base(op: str) -> str:
    """``aten.add.Tensor`` -> ``add``: the name without namespace and overload."""
    return op.removeprefix("aten.").rsplit(".", 1)[0]


def similar_ops(op: str, known, n: int = 3) -> list[str]:
    """Ops with rules whose name is close to ``op``'s: another overload of the same op first,
    then near spellings of the op's own name (``convolutoin``), compared without the shared
    ``aten.`` and ``.default`` that made every op look alike (``logical_not`` ~ ``gather``)."""
    base = _op_base(op)
    by_base: dict = {}
    for k in known:
        if k != op:
            by_base.setdefault(_op_base(k), []).append(k)
    names = [base] + difflib.get_close_matches(base, [b for b in by_base if b != base], n=n, cutoff=0.8)
    return [k for b in names for k in by_base.get(b, [])][:n]


def no_rule_reason(packs, op: str) -> Reason:
    packs = _packs(packs)
    labels = ", ".join(p.label for p in packs) or "no packs"
    for p in packs:
        why = p.no_rule_reason(op)
        if why:
            return Reason("no_rule", f"no rule for {op} in {labels}: {why}")
    close = similar_ops(op, sorted({o for p in packs for o in p.ops}))
    hint = f"; similar ops with rules: {', '.join(close)}" if close else ""
    return Reason("no_rule", f"no rule for {op} in {labels}{hint}")


def _match_rule(pack: RulePack, rule: Rule, hcd, op: str, call: Call | None, dtype, layout):
    chip = _view(hcd)
    values: dict = {}
    if call is not None:
        values, err = rule.bind_args(call)
        if err:
            return Rejection(op, (Reason("args", err, rule=rule.id),), rule)
        if dtype is None:
            dtype = call.dtype
        if layout is None:
            layout = call.layout
        prim = rule.primary_value(values)
        if dtype is None and isinstance(prim, TensorMeta):
            dtype = prim.dtype
    reasons, unit, allowed, warnings = requirements(rule, hcd, dtype, layout)
    if rule.requires.layouts == "none":
        layout = None
    if reasons:
        return Rejection(op, tuple(reasons), rule)
    if call is None:
        return _static(pack, rule, hcd, op, dtype, unit, layout, allowed, warnings, chip)
    env = call_env(rule, values, call, dtype, layout, chip)
    bound = _guard_and_bind(rule, op, env)
    if isinstance(bound, Rejection):
        return bound
    inputs, attrs = bound
    return Match(op, rule.kernel, rule, pack.label, dtype, unit, layout, allowed, inputs, attrs, tuple(warnings))


def _guard_and_bind(owner, name: str, env):
    """Evaluate a rule's or fusion's guards, then its bindings: (inputs, attrs) or the Rejection."""
    for g in owner.guards:
        ok, why = g.guard.test(env)
        if not ok:
            return Rejection(name, (_guard_reason(owner, g, why),), owner)
    try:
        return _bind(owner, env)
    except GuardEvalError as exc:
        return Rejection(name, (Reason("bind", f"{owner.id}: cannot bind the kernel's arguments: {exc.message}",
                                       rule=owner.id),), owner)


def _guard_reason(rule, g, why) -> Reason:
    extra = f" ({g.reason})" if g.reason else ""
    return Reason("guard", f"{rule.id}: guard `{g.text.strip()}` is false{extra}: {why}", rule=rule.id,
                  guard=g.text.strip())


def _free_names(node: S.Node) -> set[str]:
    names, bound, stack = set(), set(), [node]
    while stack:
        n = stack.pop()
        if isinstance(n, S.Name):
            names.add(n.id)
        elif isinstance(n, S.Comprehension):
            bound.add(n.var)
        for value in getattr(n, "__dict__", {}).values():
            if isinstance(value, S.Node):
                stack.append(value)
            elif isinstance(value, tuple):
                stack.extend(v for v in value if isinstance(v, S.Node))
    return names - bound


def _static(pack, rule, hcd, op, dtype, unit, layout, allowed, warnings, chip):
    pending = []
    env = {"chip": chip, "dtype": dtype, "compute_dtype": dtype, "layout": layout, "compute_layout": layout}
    chip_only = CHIP_ONLY - set(rule.arg_names())  # an arg named dtype/layout is the call's, not the candidate's
    for g in rule.guards:
        if _free_names(g.guard.tree) <= chip_only and (layout is not None or not
                                                        {"layout", "compute_layout"} & _free_names(g.guard.tree)):
            ok, why = g.guard.test(env)
            if not ok:
                return Rejection(op, (_guard_reason(rule, g, why),), rule)
        else:
            pending.append(g.text.strip())
    return Match(op, rule.kernel, rule, pack.label, dtype, unit, layout, allowed, {}, {}, tuple(warnings),
                 tuple(pending))


def _bind(rule, env) -> tuple[dict, dict]:
    params = K.kernel_params(rule.kernel)
    inputs, attrs = {}, {}
    for b in rule.bind:
        value = b.value(env)
        if params is not None:
            (inputs if b.name in params[0] else attrs)[b.name] = value
        else:
            (inputs if isinstance(value, TensorMeta) or value is None and b.expr is not None else attrs)[b.name] = value
    return inputs, attrs


# -- fusions ---------------------------------------------------------------------------

def match_fusion(fusion: Fusion, hcd, calls: Mapping[str, Call], *, dtype: str | None = None,
                 layout: str | None = None, pack: str | None = None, swaps=()) -> Match | Rejection:
    """Does ``fusion`` serve this group? ``calls`` maps each pattern step id to its call.

    ``swaps`` is the group's orientation (:attr:`torchfl.rules.groups.Group.swaps`, found
    with the group): a ``commutative`` step whose producer arrives in another operand
    (``add(x, conv)``) has its operands read in the pattern's order, so guards and binds
    see ``add.other`` as the residual whichever side it is on.
    """
    name = f"fusion {fusion.name}"
    chip = _view(hcd)
    env: dict[str, Any] = {"chip": chip}
    first_primary = None
    for step in fusion.steps:
        call = calls.get(step.id)
        if call is None:
            return Rejection(name, (Reason("args", f"{fusion.id}: no call given for step {step.id}", rule=fusion.id),),
                             fusion)
        rule = fusion.rule_for(step.id)
        values, err = rule.bind_args(call)
        if err:
            return Rejection(name, (Reason("args", f"{fusion.id} step {step.id}: {err}", rule=fusion.id),), fusion)
        values = oriented(values, step.id, swaps)
        values["out"] = call.out
        env[step.id] = values
        if first_primary is None:
            first_primary = rule.primary_value(values)
            if dtype is None:
                dtype = call.dtype or (first_primary.dtype if isinstance(first_primary, TensorMeta) else None)
            if layout is None:
                layout = call.layout
    reasons, unit, allowed, warnings = requirements(fusion, hcd, dtype, layout)
    if fusion.requires.layouts == "none":
        layout = None
    if reasons:
        return Rejection(name, tuple(reasons), fusion)
    if isinstance(first_primary, TensorMeta):
        env["shape"], env["rank"] = list(first_primary.shape), len(first_primary.shape)
    env.update(dtype=dtype, compute_dtype=dtype, layout=layout, compute_layout=layout, out=None)
    bound = _guard_and_bind(fusion, name, env)
    if isinstance(bound, Rejection):
        return bound
    inputs, attrs = bound
    return Match(name, fusion.kernel, fusion, pack or fusion.pack, dtype, unit, layout, allowed, inputs, attrs,
                 tuple(warnings))


def fusion_static(fusion: Fusion, hcd, dtype: str, layout: str | None = None) -> Match | Rejection:
    """Requirements of a fusion on a chip alone (support queries)."""
    reasons, unit, allowed, warnings = requirements(fusion, hcd, dtype, layout)
    if reasons:
        return Rejection(f"fusion {fusion.name}", tuple(reasons), fusion)
    pending = tuple(g.text.strip() for g in fusion.guards)
    return Match(f"fusion {fusion.name}", fusion.kernel, fusion, fusion.pack, dtype, unit, layout, allowed,
                 {}, {}, tuple(warnings), pending)


__all__ = ["Match", "Rejection", "Reason", "candidates", "match", "match_fusion", "fusion_static", "requirements",
           "chip_label", "show"]
