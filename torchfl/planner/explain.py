"""``Plan.explain``: text in the spirit of PostgreSQL's EXPLAIN, JSON, and Graphviz DOT.

Text: the headline (``N of M nodes on <chip> in K kernels (F fused groups), C layout
conversions, B fallbacks to CPU``), one line per step (kernel, covered ops, layouts,
dtype, tiling, predicted time and off-chip bytes) with a detail line saying why the
tiling was chosen, totals, then rejected alternatives, folded nodes, fallbacks and notes.
"""

from __future__ import annotations

import hashlib

from torchfl.planner.errors import ChoiceError

FORMATS = ("text", "json", "dot")
MAX_REJECTED_TEXT = 40


def explain(plan, format: str = "text") -> str:  # noqa: A002
    if format == "json":
        return plan.to_json()
    if format == "text":
        return _text(plan)
    if format == "dot":
        return _dot(plan)
    raise ChoiceError(f"unknown explain format {format!r}; choose one of {', '.join(FORMATS)}")


def _time(s: float) -> str:
    if s == float("inf"):
        return "inf"
    for unit, k in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= k:
            return f"{s / k:.3g} {unit}"
    return f"{s * 1e9:.3g} ns"


def _bytes(b: float) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= k:
            return f"{b / k:.3g} {unit}"
    return f"{int(b)} B"


def _tiling(tile: dict) -> str:
    if not tile:
        return "-"
    strategy = tile.get("strategy", "?")
    tiles = tile.get("tiles") or {}
    parts = [f"{k}={v}" for k, v in tiles.items()] if isinstance(tiles, dict) else []
    text = strategy + (f" ({' '.join(parts)})" if parts else "")
    if tile.get("double_buffered"):
        text += " 2buf"
    return text


def _covers(step) -> str:
    if step.kind in ("cast", "layout"):
        return step.inputs[0] if step.inputs else ""
    ops = [o.removeprefix("aten.").rsplit(".", 1)[0] for o in step.ops]
    return "+".join(ops) + f" [{step.nodes[0]}" + (f"..{step.nodes[-1]}]" if len(step.nodes) > 1 else "]")


def _text(plan) -> str:
    s = plan.summary
    lines = [s.headline(plan.chip)]
    pol = f"precision policy {plan.precision} (fp32 accumulation, outputs in the caller's dtype)" \
        if plan.precision else "no precision policy (graph dtypes as written)"
    lines.append(f"Plan for {plan.chip} {plan.chip_version}; {pol}; {len(plan.steps)} steps, {s.casts} casts")
    rows = [("#", "kind", "kernel", "covers", "layout", "dtype", "tiling", "time", "bytes")]
    details = []
    static_casts = [st for st in plan.steps if st.kind == "cast" and st.static]
    if static_casts:
        t = sum(st.predicted_time_s for st in static_casts)
        b = sum(st.predicted_bytes for st in static_casts)
        kinds = sorted({f"{plan.values[st.inputs[0]].dtype}->{st.dtype}" for st in static_casts})
        lines.append(f"Parameter casts: {len(static_casts)} static cast steps ({', '.join(kinds)}; steps "
                     f"{static_casts[0].index}..{static_casts[-1].index}), {_time(t)}, {_bytes(b)}, run once; "
                     "--format json lists each")
    for st in plan.steps:
        if st.kind == "cast" and st.static:
            continue
        lay_in = ",".join(dict.fromkeys(st.layouts_in)) or "-"
        layout = f"{lay_in}->{st.layout_out}" if lay_in != st.layout_out else st.layout_out
        kind = st.kind + ("*" if st.static else "")
        where = st.kernel or ("host" if st.kind == "fold" else "cpu")
        rows.append((str(st.index), kind, where, _covers(st), layout, st.dtype, _tiling(st.tile),
                     _time(st.predicted_time_s), _bytes(st.predicted_bytes)))
        details.append(st.note)
    widths = [min(max(len(r[i]) for r in rows), 48) for i in range(len(rows[0]))]

    def fmt(r):
        cells = [c if len(c) <= widths[i] else c[: widths[i] - 1] + "~" for i, c in enumerate(r)]
        return "  ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip()

    lines.append(fmt(rows[0]))
    lines.append("  ".join("-" * w for w in widths))
    for r, note in zip(rows[1:], details):
        lines.append(fmt(r))
        if note and r[1] not in ("cast", "cast*"):
            lines.append(" " * (widths[0] + 2) + "-> " + note)
    lines.append(f"Total: predicted {_time(s.predicted_time_s)}, {_bytes(s.predicted_bytes)} off-chip, "
                 f"{s.predicted_flops:.4g} ops  (* = static: depends only on parameters, may run once)")
    if plan.memory is not None:
        lines.append(memory_line(plan))
    if plan.rejected:
        lines.append(f"Rejected alternatives ({len(plan.rejected)}):")
        for r in plan.rejected[:MAX_REJECTED_TEXT]:
            lines.append(f"  {'+'.join(r.nodes)}: {r.kernel}: {'; '.join(r.reasons)}")
        if len(plan.rejected) > MAX_REJECTED_TEXT:
            lines.append(f"  ... and {len(plan.rejected) - MAX_REJECTED_TEXT} more (--format json lists all)")
    if plan.folded:
        lines.append(f"Folded on the host ({len(plan.folded)}; input-independent, computed once and kept on "
                     "the chip):")
        for f in plan.folded:
            lines.append(f"  {f.node} ({f.op}): no kernel: {f.reason}")
    if plan.fallbacks:
        lines.append(f"Fallbacks to CPU ({len(plan.fallbacks)}):")
        for f in plan.fallbacks:
            lines.append(f"  {f.node} ({f.op}): {f.reason}")
    for note in plan.notes:
        lines.append(f"Note: {note}")
    return "\n".join(lines) + "\n"


def memory_line(plan) -> str:
    """One line: the plan's peak device memory, the step where it occurs, what it holds."""
    from torchfl.planner.memory import fmt_bytes

    mp = plan.memory
    where = "during the uploads" if mp.peak_step < 0 else f"at step {mp.peak_step}"
    cap = "no capacity given (off_chip_memory.size_gb)" if mp.capacity is None else \
        f"{100 * mp.peak_bytes / mp.capacity:.1f}% of {fmt_bytes(mp.capacity)}"
    parts = ", ".join(f"{k} {fmt_bytes(n)}" for k, n in mp.breakdown().items() if n)
    return (f"Device memory: peak {fmt_bytes(mp.peak_bytes)} {where} ({parts}); {cap}; "
            f"{fmt_bytes(mp.resident_bytes)} stays resident between calls")


_PALETTE = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
            "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f")


def _colour(kernel: str | None) -> str:
    if kernel is None:
        return "#ff4d4d"
    return _PALETTE[int(hashlib.sha256(kernel.encode()).hexdigest(), 16) % len(_PALETTE)]


def _q(text: str) -> str:
    """A DOT string literal; newlines become DOT's ``\\n`` line breaks."""
    escaped = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped + '"'


def _dot(plan) -> str:
    out = ["digraph plan {", "  rankdir=TB;", '  node [shape=box, style="rounded,filled", fontname="Helvetica"];',
           f"  label={_q(plan.summary.headline(plan.chip))}; labelloc=t;"]
    entry, exit_ = {}, {}
    for inp in plan.inputs:
        if inp.kind == "input":
            out.append(f"  {_q('in:' + inp.name)} [shape=ellipse, fillcolor=white, label={_q(inp.name)}];")
    for st in plan.steps:
        sid = f"s{st.index}"
        colour = "#e0e0e0" if st.kind == "fold" else _colour(st.kernel if st.kind != "fallback" else None)
        tip = f"{st.kind} {st.kernel or 'cpu'}\n{st.layout_out} {st.dtype}\n{_time(st.predicted_time_s)}"
        if st.kind == "fused":
            out.append(f"  subgraph cluster_{st.index} {{")
            out.append(f"    label={_q(f'fused {st.kernel} ({_time(st.predicted_time_s)})')}; style=filled; "
                       f"fillcolor={_q('#f4f4f4')};")
            names = [f"{sid}_{i}" for i in range(len(st.ops))]
            for name, op in zip(names, st.ops):
                out.append(f"    {_q(name)} [fillcolor={_q(colour)}, label={_q(op.removeprefix('aten.'))}];")
            for a, b in zip(names, names[1:]):
                out.append(f"    {_q(a)} -> {_q(b)};")
            out.append("  }")
            entry[st.index], exit_[st.index] = names[0], names[-1]
        else:
            shape = {"cast": "hexagon", "layout": "parallelogram", "fallback": "octagon",
                     "fold": "note"}.get(st.kind, "box")
            host = "host (folded)" if st.kind == "fold" else "CPU"
            label = (f"{st.kernel or host}\n{_covers(st)}" if st.kind in ("kernel", "fallback", "fold")
                     else f"{st.kernel}\n{st.inputs[0]} -> {st.layout_out if st.kind == 'layout' else st.dtype}")
            out.append(f"  {_q(sid)} [shape={shape}, fillcolor={_q(colour)}, label={_q(label)}, "
                       f"tooltip={_q(tip)}];")
            entry[st.index] = exit_[st.index] = sid
    for st in plan.steps:
        for v in st.inputs:
            if not v:
                continue
            src = plan.values[v].producer
            if src is None:
                inp = next((i for i in plan.inputs if i.name == v and i.kind == "input"), None)
                if inp is not None:
                    out.append(f"  {_q('in:' + v)} -> {_q(entry[st.index])};")
                continue
            out.append(f"  {_q(exit_[src])} -> {_q(entry[st.index])} [label={_q(plan.values[v].layout)}];")
    for i, name in enumerate(plan.outputs):
        out.append(f"  {_q('out:' + str(i))} [shape=ellipse, fillcolor=white, label={_q('output ' + str(i))}];")
        src = plan.values[name].producer
        if src is not None:
            out.append(f"  {_q(exit_[src])} -> {_q('out:' + str(i))};")
    out.append("}")
    return "\n".join(out) + "\n"
