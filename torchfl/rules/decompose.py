"""Matching a decomposition (``decompositions:`` in a rule pack) on a chip and a call.

``expand(dec, hcd, call)`` checks the decomposition's requirements and guards like a rule's
and evaluates its parts in order: each part's arguments are expressions over the op's
arguments and the earlier parts' values (a part's value is a :class:`Part` standing for the
tensor it will compute; its shape is the planner's business). A part whose ``when`` is false
is skipped and its value is its first argument's. The result is the list of parts to build,
or a :class:`~torchfl.rules.matching.Rejection` saying why the decomposition does not apply.
Nothing is executed; the planner (``torchfl.planner.decompose``) builds and prices the parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from torchfl.rules.call import Call, TensorMeta
from torchfl.rules.guards import GuardEvalError
from torchfl.rules.matching import Reason, Rejection, _guard_reason, _view, chip_label
from torchfl.rules.pack import Decomposition, call_env


@dataclass(frozen=True, eq=False)
class Part:
    """A part to build: ``op`` over ``args``/``kwargs``, whose values are constants, the
    call's TensorMetas, or earlier Parts."""

    id: str
    op: str
    args: tuple
    kwargs: dict


def decompositions_for(packs, op: str) -> list[Decomposition]:
    return [d for p in packs for d in getattr(p, "decompositions", ()) if d.op == op]


def _requirements(dec: Decomposition, hcd) -> list[Reason]:
    att = hcd.compute_units.attention
    enabled = att is not None and att.enabled
    if dec.requires.attention is False and enabled:
        return [Reason("attention", f"{dec.id} is for chips without an attention unit; {chip_label(hcd)} has "
                       "compute_units.attention enabled (its own limits apply, never a silent decomposition)",
                       "compute_units.attention.enabled", True, dec.id)]
    if dec.requires.attention and not enabled:
        return [Reason("attention", f"{dec.id} needs compute_units.attention, absent or disabled on "
                       f"{chip_label(hcd)}", "compute_units.attention", None, dec.id)]
    return []


def expand(dec: Decomposition, hcd, call: Call) -> list[Part] | Rejection:
    """The parts of ``dec`` for ``call`` on ``hcd``, or why it does not apply."""
    values, err = dec.bind_args(call)
    if err:
        return Rejection(dec.op, (Reason("args", err, rule=dec.id),), None)
    reasons = _requirements(dec, hcd)
    if reasons:
        return Rejection(dec.op, tuple(reasons), None)
    prim = dec.primary_value(values)
    dtype = prim.dtype if isinstance(prim, TensorMeta) else None
    env = call_env(dec, values, call, dtype, None, _view(hcd))
    for g in dec.guards:
        ok, why = g.guard.test(env)
        if not ok:
            return Rejection(dec.op, (_guard_reason(dec, g, why),), None)
    parts: list[Part] = []
    for spec in dec.parts:
        try:
            args = tuple(b.value(env) for b in spec.args)
            if spec.when is not None and not spec.when.value(env):
                env[spec.id] = args[0] if args else None
                continue
            kwargs = {b.name: b.value(env) for b in spec.kwargs}
        except GuardEvalError as exc:
            return Rejection(dec.op, (Reason("bind", f"{dec.id}: part {spec.id} ({spec.op}) cannot be built for "
                                             f"this call: {exc.message}", rule=dec.id),), None)
        part = Part(spec.id, spec.op, args, kwargs)
        env[spec.id] = part      # later expressions pass it on; its shape is the planner's to compute
        parts.append(part)
    if not parts:
        return Rejection(dec.op, (Reason("bind", f"{dec.id}: every part was skipped for this call", rule=dec.id),),
                         None)
    return parts
