"""The evidence matrix (ops x chips) from a registry, as text, JSON or a Markdown table.

No torch here: it reads the claims (``rules.support.chip_ops``) and the stored verdicts
(``Registry.evidence``), so ``torchfl conformance --report`` is quick and needs no run.
A cell is the claim's state (``registry.evidence.claim_state``): verified, partial,
failing, refused, stale or unverified; ``-`` where the chip claims nothing for the op.
"""

from __future__ import annotations

from torchfl.registry.evidence import STATES, claim_state, describe

SYMBOL = {"verified": "pass", "partial": "partial", "failing": "FAIL", "refused": "refused", "stale": "stale",
          "unverified": "?", None: "-"}


def build(reg, chips=None) -> dict:
    """``{"chips": [...], "ops": [{"op", "cells": {chip: describe() or None}}], "totals": {chip: {...}}}``."""
    from torchfl.rules.support import chip_ops

    packs = [reg.pack(s.name) for s in sorted(reg.packs(), key=lambda s: s.name)]
    names = list(chips) if chips else [s.name for s in reg.chips()]
    evidence = {}
    for e in reg.evidence():
        evidence.setdefault((e.identity.chip_name, e.op), []).append(e)
    claimed = {}
    versions = {}
    for name in names:
        hcd = reg.chip(name)
        versions[name] = hcd.chip.version
        claimed[name] = {o["op"] for o in chip_ops(hcd, packs)["ops"]}
    ops = sorted(set().union(*claimed.values()) | {op for (c, op) in evidence if c in names}) if names else []
    rows, totals = [], {n: dict.fromkeys(STATES, 0) for n in names}
    for op in ops:
        cells = {}
        for n in names:
            ev = evidence.get((n, op), [])
            if op not in claimed[n] and not ev:
                cells[n] = None
                continue
            d = describe(ev)
            cells[n] = d
            totals[n][d["state"]] += 1
        rows.append({"op": op, "cells": cells})
    return {"chips": [{"name": n, "version": versions[n]} for n in names], "ops": rows, "totals": totals}


def render_text(matrix: dict) -> str:
    names = [c["name"] for c in matrix["chips"]]
    width = max([len(r["op"]) for r in matrix["ops"]] + [10])
    cols = [max(len(n), 8) for n in names]
    lines = ["op".ljust(width) + "  " + "  ".join(n.ljust(w) for n, w in zip(names, cols))]
    for r in matrix["ops"]:
        cells = [_cell(r["cells"][n]).ljust(w) for n, w in zip(names, cols)]
        lines.append(r["op"].ljust(width) + "  " + "  ".join(cells))
    lines.append("")
    for n in names:
        t = matrix["totals"][n]
        lines.append(f"{n}: " + ", ".join(f"{t[s]} {s}" for s in STATES))
    return "\n".join(lines)


def render_markdown(matrix: dict) -> str:
    """A table a vendor can publish: one row per overload, one column per chip (with version)."""
    heads = [f"{c['name']} {c['version']}" for c in matrix["chips"]]
    names = [c["name"] for c in matrix["chips"]]
    lines = ["| ATen overload | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for r in matrix["ops"]:
        lines.append(f"| `{r['op']}` | " + " | ".join(_cell(r["cells"][n], md=True) for n in names) + " |")
    lines.append("")
    lines.append("| chip | " + " | ".join(STATES) + " |")
    lines.append("|---|" + "---|" * len(STATES))
    for n in names:
        t = matrix["totals"][n]
        lines.append(f"| {n} | " + " | ".join(str(t[s]) for s in STATES) + " |")
    lines.append("")
    lines.append("pass: every sample matched eager torch; partial: some did not (or were refused); FAIL: none "
                 "matched; refused: refused before running, with the HCD field or rule; stale: evidence for an "
                 "older chip or rule pack version; ?: claimed, not verified; -: not claimed.")
    return "\n".join(lines)


def _cell(d, md: bool = False) -> str:
    if d is None:
        return "-"
    state = d["state"]
    text = SYMBOL[state]
    if state in ("partial", "failing", "refused", "verified") and d.get("samples"):
        text += f" {d['passed']}/{d['samples']}"
    return f"**{text}**" if md and state == "failing" else text


__all__ = ["build", "render_text", "render_markdown", "claim_state"]
