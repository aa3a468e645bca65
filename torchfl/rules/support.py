"""The support queries (``registry ops``, ``support``, ``why-not``) as pure functions.

Inputs are HCD objects and checked rule packs, wherever they came from (the registry,
files, tests); outputs are JSON-able dicts, which the CLI prints as text or JSON. What a
chip supports follows from matching each rule against the chip alone (no call): listed
dtypes, the unit that runs each, that unit's layouts, the attention unit, device type,
and guards that read only ``chip``. Guards on the call are reported as conditions.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Sequence

from torchfl.hcd.dtypes import dtype_name
from torchfl.rules.matching import (ALL_DTYPES, _packs, candidates, chip_label, fusion_static, no_rule_reason,
                                    rule_dtypes)
from torchfl.rules.pack import RulePack


class SupportError(ValueError):
    """A query about something unknown (chip, op, dtype, layout); the message lists near matches."""


def _near(word: str, choices: Iterable[str], n: int = 4) -> str:
    choices = sorted(set(choices))
    close = difflib.get_close_matches(word, choices, n=n, cutoff=0.5)
    close += [c for c in choices if word.lower() in c.lower() and c not in close][: max(0, n - len(close))]
    return f"; did you mean {', '.join(close)}?" if close else ""


def normalise_dtype(dtype: str | None) -> str | None:
    if dtype is None:
        return None
    d = dtype_name(dtype.strip())
    if d not in ALL_DTYPES:
        raise SupportError(f"unknown dtype {dtype!r}{_near(d, ALL_DTYPES)} (dtypes: {', '.join(ALL_DTYPES)})")
    return d


def normalise_layout(layout: str | None) -> str | None:
    if layout is None:
        return None
    lay = layout.strip()
    if lay in ("channels_last",):
        return "NHWC"
    if lay in ("contiguous", "channels_first"):
        return "NCHW"
    if not (lay.isalpha() and lay.isupper() and len(set(lay)) == len(lay)):
        raise SupportError(f"layout {layout!r} is not a permutation of dimension letters such as NCHW, NHWC, NHCW")
    return lay


def known_ops(packs) -> list[str]:
    ops = []
    for p in _packs(packs):
        ops += list(p.ops) + [e.op for e in p.no_rule]
    return sorted(set(ops))


def check_op(op: str, packs) -> str:
    ops = known_ops(packs)
    if op in ops:
        return op
    for candidate in (f"aten.{op}", f"aten.{op}.default", op.replace("::", ".")):
        if candidate in ops:
            return candidate
    short = [o.split(".")[1] if o.count(".") == 2 else o for o in ops]
    hint = _near(op, ops) or _near(op.split(".")[-1], short)
    labels = ", ".join(p.label for p in _packs(packs)) or "no rule packs (import rules/core.yaml)"
    raise SupportError(f"no rule pack mentions op {op!r} ({labels}){hint}")


def _chip(hcd) -> dict:
    return {"name": hcd.chip.name, "version": hcd.chip.version, "device_type": hcd.chip.device_type}


def _serve(m) -> dict:
    return {
        "kernel": m.kernel,
        "rule": m.rule.id,
        "pack": m.pack,
        "dtype": m.dtype,
        "unit": m.unit,
        "layouts": list(m.layouts),
        "guards": list(m.pending_guards),
        "warnings": list(m.warnings),
    }


def _reason(r) -> dict:
    return r.as_dict()


def _union(lists) -> list:
    out = []
    for xs in lists:
        for x in xs:
            if x not in out:
                out.append(x)
    return out


def _op_on_chip(op: str, hcd, packs) -> tuple[list[dict], list[dict]]:
    """(serves, reasons) of one op on one chip, one entry per (rule, dtype) that matches."""
    serves, reasons = [], []
    for pack in _packs(packs):
        for rule in pack.rules_for(op):
            dts = [d for d in hcd.dtypes if d in rule_dtypes(rule)]
            if hcd.constraints.bfloat16_emulation and "bfloat16" in rule_dtypes(rule) and "bfloat16" not in dts:
                dts.append("bfloat16")
            if not dts:
                reasons.append({"code": "dtype", "rule": rule.id, "field": "tensor.supported_dtypes",
                                "value": list(hcd.tensor.supported_dtypes),
                                "message": f"{rule.id} computes in {', '.join(rule_dtypes(rule))}, none of which is "
                                           f"in tensor.supported_dtypes {list(hcd.tensor.supported_dtypes)} of "
                                           f"{chip_label(hcd)}"})
            for d in dts:
                for m in candidates(pack, hcd, op, None, dtype=d):
                    if m.rule is not rule:
                        continue
                    if m.ok:
                        serves.append(_serve(m))
                    else:
                        reasons += [dict(_reason(r), dtype=d) for r in m.reasons]
    return serves, reasons


def _summary(op: str, serves: list[dict]) -> dict:
    dtypes = _union([s["dtype"]] for s in serves)
    return {
        "op": op,
        "dtypes": dtypes,
        "layouts": _union(s["layouts"] for s in serves),
        # a dtype's layouts are its unit's, not the union across units
        "layouts_by_dtype": {d: _union(s["layouts"] for s in serves if s["dtype"] == d) for d in dtypes},
        "kernels": _union([s["kernel"]] for s in serves),
        "serves": serves,
    }


def chip_ops(hcd, packs) -> dict:
    """``registry ops --chip``: every op the chip supports (dtypes, layouts, kernels), fusions, and the rest."""
    packs = _packs(packs)
    ops, unsupported = [], []
    for op in sorted({o for p in packs for o in p.ops}):
        serves, reasons = _op_on_chip(op, hcd, packs)
        if serves:
            ops.append(_summary(op, serves))
        else:
            unsupported.append({"op": op, "reasons": _dedup(reasons)})
    fusions = []
    for p in packs:
        for f in p.fusions:
            served = []
            why = []
            for d in [d for d in hcd.dtypes if d in rule_dtypes(f)]:
                m = fusion_static(f, hcd, d)
                (served if m.ok else why).append(m)
            # a DAG pattern's second operands read "op (into step.arg)": they feed that step, not the next
            pattern = [list(s.ops) if s.into is None else [f"{o} (into {s.into}.{s.input})" for o in s.ops]
                       for s in f.steps]
            entry = {"name": f.name, "kernel": f.kernel, "pack": p.label, "pattern": pattern}
            if served:
                entry.update(dtypes=[m.dtype for m in served], layouts=_union(m.layouts for m in served),
                             guards=list(served[0].pending_guards), supported=True)
            else:
                entry.update(supported=False, reasons=_dedup(_reason(r) for m in why for r in m.reasons) or [
                    {"code": "dtype", "message": f"{f.id} computes in none of the chip's dtypes"}])
            fusions.append(entry)
    no_rule = [{"op": e.op, "reason": e.reason} for p in packs for e in p.no_rule]
    return {"chip": _chip(hcd), "packs": [p.label for p in packs], "ops": ops, "fusions": fusions,
            "unsupported": unsupported, "no_rule": no_rule}


def _dedup(reasons) -> list[dict]:
    seen, out = set(), []
    for r in reasons:
        key = r["message"]
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def op_support(op: str, chips: Sequence, packs) -> dict:
    """``registry support OP``: one op across chips."""
    op = check_op(op, packs)
    rows = []
    for hcd in chips:
        serves, reasons = _op_on_chip(op, hcd, packs)
        row = {"chip": _chip(hcd), "supported": bool(serves)}
        row.update({k: v for k, v in _summary(op, serves).items() if k != "op"})
        if not serves:
            row["reasons"] = _dedup(reasons) or [_reason(no_rule_reason(packs, op))]
        rows.append(row)
    return {"op": op, "rules": sum(len(p.rules_for(op)) for p in _packs(packs)), "chips": rows}


def why_not(op: str, hcd, packs, *, dtype: str | None = None, layout: str | None = None,
            known_layouts: Iterable[str] = ()) -> dict:
    """``registry why-not``: for each (dtype, layout) the op is not served in on this chip, every reason.

    Without ``dtype`` every dtype a rule for the op computes in is examined; without ``layout``
    every layout this chip or ``known_layouts`` (e.g. those of other chips) mention.
    """
    packs = _packs(packs)
    op = check_op(op, packs)
    dtype, layout = normalise_dtype(dtype), normalise_layout(layout)
    rules = [r for p in packs for r in p.rules_for(op)]
    result = {"op": op, "chip": _chip(hcd), "dtype": dtype, "layout": layout}
    if not rules:
        reason = no_rule_reason(packs, op)
        return dict(result, supported=False, served=[], gaps=[{"dtype": dtype, "layout": layout,
                                                               "reasons": [_reason(reason)]}])
    dtypes = [dtype] if dtype else _union([[d for d in hcd.dtypes if d in rule_dtypes(r)] for r in rules]
                                          + [list(rule_dtypes(r)) for r in rules])
    layout_sensitive = any(r.requires.layouts != "none" for r in rules)
    layouts = [layout] if layout else (_union([list(hcd.layouts), list(known_layouts)]) if layout_sensitive else [])
    served, gaps = [], []
    for d in dtypes:
        base = candidates(packs, hcd, op, None, dtype=d)
        if not any(m.ok for m in base):
            gaps.append({"dtype": d, "layout": None, "reasons": _dedup(_reason(r) for m in base for r in m.reasons)})
            continue
        if not layouts:
            served += [dict(_serve(m), layout=None) for m in base if m.ok]
            continue
        for lay in layouts:
            outcome = candidates(packs, hcd, op, None, dtype=d, layout=lay)
            ok = [m for m in outcome if m.ok]
            if ok:
                served += [dict(_serve(m), layout=lay if m.rule.requires.layouts != "none" else None) for m in ok]
            else:
                gaps.append({"dtype": d, "layout": lay,
                             "reasons": _dedup(_reason(r) for m in outcome for r in m.reasons)})
    supported = bool(served) and (not (dtype and layout) or not gaps)
    return dict(result, supported=supported, served=served, gaps=gaps, decompositions=decompositions_on(op, hcd, packs))


def decompositions_on(op: str, hcd, packs) -> list[dict]:
    """The pack decompositions of ``op`` this chip's HCD allows: the planner may serve the op
    by their parts (each matched by its own rule) where a call meets their guards."""
    from torchfl.rules.decompose import _requirements, decompositions_for

    return [{"rule": d.id, "parts": list(dict.fromkeys(p.op for p in d.parts)), "guards": [g.text for g in d.guards]}
            for d in decompositions_for(_packs(packs), op) if not _requirements(d, hcd)]


def layouts_of(chips: Sequence) -> list[str]:
    return _union(list(h.layouts) for h in chips)


__all__ = ["SupportError", "chip_ops", "op_support", "why_not", "decompositions_on", "normalise_dtype", "normalise_layout", "check_op",
           "known_ops", "layouts_of", "RulePack"]
