"""``Plan.explain``: text in the spirit of PostgreSQL's EXPLAIN, JSON, and Graphviz DOT.

Text: the headline (``N of M nodes on <chip> in K kernels (F fused groups), C layout
conversions, B fallbacks to CPU``), one line per step (kernel, covered ops, layouts,
dtype, tiling, predicted time and off-chip bytes) with a detail line saying why the
tiling was chosen, totals, then rejected alternatives, folded nodes, fallbacks and notes.
"""

from __future__ import annotations

import hashlib

from torchfl.kernels.units import fmt_bytes
from torchfl.planner.errors import ChoiceError
from torchfl.planner.texttable import human_time

FORMATS = ("text", "json", "dot")
MAX_REJECTED_TEXT = 40


def _bytes(n) -> str:
    """Bytes in a table column or a summary line: binary units, 3 significant digits."""
    return fmt_bytes(n, compact=True)


def render_plan(plan, format: str = "text", width: int | None = None) -> str:  # noqa: A002
    """The text of ``Plan.explain``: EXPLAIN-style ``text`` (fitted to ``width``, default the
    terminal's or 100 columns in a pipe), ``json`` or Graphviz ``dot``."""
    if format == "json":
        return plan.to_json()
    if format == "text":
        from .texttable import terminal_width

        return _text(plan, terminal_width() if width is None else width)
    if format == "dot":
        return _dot(plan)
    raise ChoiceError(f"unknown explain format {format!r}; choose one of {', '.join(FORMATS)}")


_time = human_time     # the name other modules import


def tiling_text(tile: dict) -> str:
    """``resident (m=32 n=768 k=768) 2buf``: a step's tile configuration as explain shows it."""
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
    ops = [o.removeprefix("aten.").removeprefix("quantized_decomposed.").rsplit(".", 1)[0] for o in step.ops]
    return "+".join(ops) + f" [{step.nodes[0]}" + (f"..{step.nodes[-1]}]" if len(step.nodes) > 1 else "]")


def _operand_names(step) -> tuple:
    """The kernel's names for the step's inputs (``x``, ``w``, ``bias``), else ``in0``..."""
    names = ()
    if step.kernel and step.kind in ("kernel", "fused"):
        from torchfl.kernels.catalog import CATALOG

        spec = CATALOG.get(step.kernel)
        names = spec.input_names if spec is not None else ()
    return tuple(names[i] if i < len(names) else f"in{i}" for i in range(len(step.inputs)))


def _layout(step) -> str:
    """``NCL``, or ``x:NCL w:AB -> NCL`` when operands differ; ``scalar`` for 0-d. A 1-d or
    0-d operand (``A``, scalar) has one layout only and is not listed."""
    out = step.layout_out or "scalar"
    ins = [(n, lay) for n, v, lay in zip(_operand_names(step), step.inputs, step.layouts_in)
           if v and lay and len(lay) > 1]
    if all(lay == out for _n, lay in ins):
        return out
    if len(ins) == 1:
        return f"{ins[0][1]} -> {out}"
    return " ".join(f"{n}:{lay}" for n, lay in ins) + f" -> {out}"


def _text(plan, width: int) -> str:
    from functools import partial

    from .texttable import paragraph as _paragraph, table_blocks

    paragraph = partial(_paragraph, width=width)

    s = plan.summary
    lines = paragraph(s.headline(plan.chip))
    trust = confidence_line(plan)
    if trust:
        lines += paragraph(trust)
    pol = f"precision policy {plan.precision} (fp32 accumulation, outputs in the caller's dtype)" \
        if plan.precision else "no precision policy (graph dtypes as written)"
    lines += paragraph(f"Plan for {plan.chip} {plan.chip_version}; {pol}; {len(plan.steps)} steps, {s.casts} casts")
    once = [st for st in plan.steps if st.static]
    per_call = [st for st in plan.steps if not st.static]
    static_casts = [st for st in once if st.kind == "cast"]
    if static_casts:
        t = sum(st.predicted_time_s for st in static_casts)
        b = sum(st.predicted_bytes for st in static_casts)
        kinds = sorted({f"{plan.values[st.inputs[0]].dtype}->{st.dtype}" for st in static_casts})
        lines += paragraph(f"Parameter casts: {len(static_casts)} static cast steps ({', '.join(kinds)}; steps "
                           f"{static_casts[0].index}..{static_casts[-1].index}), {_time(t)}, {_bytes(b)}, run once "
                           "(not in the per-call total); --format json lists each")
    header = ("#", "kind", "kernel", "covers", "layout", "dtype", "tiling", "time", "bytes")
    rows, details = [], []
    for st in plan.steps:
        if st.kind == "cast" and st.static:
            continue
        kind = st.kind + ("*" if st.static else "")
        where = st.kernel or ("host" if st.kind == "fold" else "cpu")
        rows.append((str(st.index), kind, where, _covers(st), _layout(st), st.dtype, tiling_text(st.tile),
                     _time(st.predicted_time_s), _bytes(st.predicted_bytes)))
        # casts explain themselves; a fold's reason is listed under "Folded on the host"
        details.append(st.note if st.note and st.kind not in ("cast", "fold") else "")
    head, blocks = table_blocks(header, rows, right={0, 7, 8}, shrink_first=(3, 4, 6), width=width)
    lines += head
    indent = " " * (max((len(r[0]) for r in rows), default=1) + 2)
    for block, note in zip(blocks, details):
        lines += block
        if note:          # why this tiling, under its row, wrapped to the same width
            lines += paragraph("-> " + note, indent=indent, subsequent=indent + "   ")
    lines += paragraph(f"Per call: predicted {_time(s.per_call_time_s)}, {_bytes(s.per_call_bytes)} off-chip, "
                       f"{sum(st.predicted_flops for st in per_call):.4g} ops over {len(per_call)} steps")
    if once:
        lines += paragraph(f"Run once (static: parameter casts, folded and other parameter-only steps, results kept "
                           f"on the chip): {_time(s.run_once_time_s)}, {_bytes(s.run_once_bytes)} over "
                           f"{len(once)} steps")
    if plan.memory is not None:
        lines += paragraph(memory_line(plan))
    lines += _legend(rows, paragraph)
    if plan.rejected:
        lines.append(f"Rejected alternatives ({len(plan.rejected)}):")
        for r in plan.rejected[:MAX_REJECTED_TEXT]:
            lines += paragraph(f"{'+'.join(r.nodes)}: {r.kernel}: {'; '.join(r.reasons)}", indent="  ")
        if len(plan.rejected) > MAX_REJECTED_TEXT:
            lines.append(f"  ... and {len(plan.rejected) - MAX_REJECTED_TEXT} more (--format json lists all)")
    for d in getattr(plan, "decomposed", ()):
        parts = ", ".join(f"{p} ({o.removeprefix('aten.').rsplit('.', 1)[0]})" for p, o in zip(d.parts, d.part_ops))
        lines += paragraph(f"Decomposed: {d.node} ({d.op}) by {d.rule} into {len(d.parts)} parts, predicted "
                           f"{_time(d.predicted_time_s)} vs {_time(d.alternative_time_s)} for {d.alternative}: {parts}")
    if plan.folded:
        lines.append(f"Folded on the host ({len(plan.folded)}; input-independent, computed once and kept on "
                     "the chip):")
        for f in plan.folded:
            lines += paragraph(f"{f.node} ({f.op}): no kernel: {f.reason}", indent="  ")
    if plan.fallbacks:
        lines.append(f"Fallbacks to CPU ({len(plan.fallbacks)}):")
        for f in plan.fallbacks:
            lines += paragraph(f"{f.node} ({f.op}): {f.reason}", indent="  ")
    for note in plan.notes:
        lines += paragraph(f"Note: {note}")
    return "\n".join(lines) + "\n"


def confidence_line(plan) -> str:
    """``Confidence: 100% of this time priced from assumed or unstated numbers (time by term: launch
    67%, ...)``: what the per-call time stands on (:mod:`torchfl.planner.confidence`), for a plan made
    in this process (its target known); "" for a plan read from JSON. How well the chip is checked
    out of sample is the registry's to say (``plan explain`` prints it as its Fidelity line)."""
    target = getattr(plan, "target", None)
    if target is None:
        return ""
    from torchfl.planner.confidence import confidence

    text = confidence(plan, target).line(checked=False)
    return "C" + text[1:].replace("this time", "the per-call time", 1)


def memory_line(plan) -> str:
    """One line: the plan's peak device memory, the step where it occurs, what it holds."""

    mp = plan.memory
    where = "during the uploads" if mp.peak_step < 0 else f"at step {mp.peak_step}"
    cap = "no capacity given (off_chip_memory.size_gb)" if mp.capacity is None else \
        f"{100 * mp.peak_bytes / mp.capacity:.1f}% of {fmt_bytes(mp.capacity)}"
    parts = ", ".join(f"{k} {fmt_bytes(n)}" for k, n in mp.breakdown().items() if n)
    return (f"Device memory: peak {fmt_bytes(mp.peak_bytes)} {where} ({parts}); {cap}; "
            f"{fmt_bytes(mp.resident_bytes)} stays resident between calls")


def _legend(rows, paragraph) -> list[str]:
    """What the table's markers mean: only those that appear in it."""
    if not rows:
        return []
    kinds = {r[1] for r in rows}
    layouts = " ".join(r[4] for r in rows)
    items = []
    if any(k.endswith("*") for k in kinds):
        items.append("* after the kind = static: reads only parameters and constants, runs once, its result kept "
                     "on the chip")
    items.append("layout = letters of the dimensions as stored, outermost first (NCHW / NHWC: batch, channels, "
                 "height, width; NCL, AB, A: a 3-, 2-, 1-d tensor in its logical order)"
                 + ("; x:AB -> NCL = the kernel's operand x stored AB, the output NCL" if ":" in layouts else "")
                 + ("; scalar = a 0-d value" if "scalar" in layouts else ""))
    if any(" 2buf" in r[6] for r in rows):
        items.append("2buf = double-buffered tiles (the next tile loads while one computes)")
    if any(r[2] == "host" for r in rows):
        items.append("host = computed by torch on the host (folded: once)")
    items.append("-> = why the planner chose this tiling; time and bytes are the predicted per-step cost "
                 "(bytes moved between off-chip memory and the on-chip cache)")
    out = ["Legend:"]
    for it in items:
        out += paragraph(it, indent="  ", subsequent="    ")
    return out


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
