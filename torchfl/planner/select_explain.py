"""The user's message when no cover of the graph exists (:class:`~torchfl.planner.select.
SelectionError` -> :class:`~torchfl.planner.errors.NoCoverError`).

The selection only sees option keys; the candidates know why each rule and fusion was refused
(``Candidates.rejected``: nodes, kernel, reasons). This module puts the two together: the node,
its op, its inputs' and output's shapes and dtypes, every rule or fusion tried on it and why each
was refused, the options that did exist, the HCD fields the refusals name, and what to do.
"""

from __future__ import annotations

import re

from torchfl.planner.errors import NoCoverError

# an HCD field path as the rules' reasons spell it (tensor.supported_dtypes, chip.device_type, ...)
_FIELD = re.compile(r"\b(?:chip|compute_units|memory|tensor|constraints|execution)\.[a-z0-9_]+(?:\.[a-z0-9_]+)*")
_SHOWN = 12   # refusals listed; the rest are counted


def _value(ir, name: str) -> str:
    info = ir.values.get(name)
    if info is None:
        return name
    return f"{name} {list(info.shape)} {info.dtype}"


def no_cover(exc, ir, cands, chip_name: str) -> NoCoverError:
    """A :class:`NoCoverError` for ``exc`` (a SelectionError) on the planned graph ``ir`` with
    its candidates ``cands``, on the chip called ``chip_name``."""
    node = ir.nodes.get(exc.node) if exc.node else None
    if node is None:   # no one node to blame (a fusion group left open at the end of the graph)
        return NoCoverError(f"cannot plan the graph on {chip_name}: {exc}; report this with the model "
                            "(`torchfl plan explain MODEL --chip ... --format json` shows the candidates)",
                            node=None, op=None, tried=())
    ins = ", ".join(_value(ir, v) for v in node.inputs) or "no tensor inputs"
    out = ir.values.get(node.name)
    head = (f"cannot plan node {node.name} ({node.op}: {ins} -> "
            f"{list(out.shape) if out is not None else '?'} {out.dtype if out is not None else ''}".rstrip()
            + f") on {chip_name}")
    tried: list[str] = []
    for nodes, kernel, reasons in cands.rejected:
        if node.name in nodes:
            what = f"kernel {kernel}" if kernel else "rules"
            where = "" if nodes == (node.name,) else f" (fused group {'+'.join(nodes)})"
            tried.append(f"{what}{where}: {'; '.join(reasons)}")
    tried = list(dict.fromkeys(tried))
    fields = sorted({f for t in tried for f in _FIELD.findall(t)})
    options = [o for o in exc.options]
    why = ("its only options are " + ", ".join(options[:6]) + (" ..." if len(options) > 6 else "")
           + " and none can be chained with the nodes around it") if options else "no kernel option covers it"
    fix = ("change the HCD field(s) " + ", ".join(fields) + " so that a refused rule applies, or "
           if fields else "relax the refusals below in the chip's HCD or rule pack, or ")
    fix += ("keep this part of the model off the chip: wrap the submodule that calls it in "
            "torch.compiler.disable (it then runs on the CPU), or plan on another chip (`torchfl registry "
            f"support {node.op}` lists the chips with a kernel for it)")
    lines = [f"{head}: {why}; {fix}"]
    lines += [f"  tried {t}" for t in tried[:_SHOWN]]
    if len(tried) > _SHOWN:
        lines.append(f"  ... and {len(tried) - _SHOWN} more refusals")
    if not tried:
        lines.append(f"  selection: {exc}")
    return NoCoverError("\n".join(lines), node=node.name, op=node.op, tried=tuple(tried))
