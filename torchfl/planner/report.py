"""``torchfl plan report``: one self-contained HTML page to look at a plan (or a comparison).

Figures are drawn by matplotlib (SVG, text as paths, inlined: the page loads nothing):

* the plan as a graph, steps coloured by kernel family, CPU fallbacks red, host folds grey;
* a roofline: each chip step's operations per byte against the ops/s its predicted time
  gives, under the chip's compute ceilings (per dtype) and its off-chip bandwidth slope;
* the memory timeline: bytes live at each step by buffer kind, the peak and the capacity;
* the explain table; with several chips, a comparison table and bar charts.

matplotlib is an optional dependency (the ``report`` extra), imported only here.
"""

from __future__ import annotations

import html
import io

__all__ = ["render_report", "ReportError"]

_FAMILY_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f",
                   "#bab0ac", "#86bcb6", "#d37295", "#a0cbe8", "#8cd17d")
_KIND_COLOURS = {"input": "#a0cbe8", "parameter": "#4e79a7", "weight": "#f28e2b", "folded": "#bab0ac",
                 "activation": "#59a14f", "output": "#b07aa1", "scratch": "#e15759", "kv_cache": "#d37295"}
FALLBACK = "#e15759"
#: the term that takes most of a plan's time (``whatif.bound_resource``'s words)
_BOUND_COLOURS = {"memory": "#f28e2b", "compute": "#4e79a7", "launch": "#b07aa1", "cache": "#59a14f",
                  "host": "#e15759"}
FOLD = "#c7c7c7"


class ReportError(RuntimeError):
    """matplotlib is missing (the message says how to install it)."""


def _plt():
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ReportError("torchfl plan report draws its figures with matplotlib, which is not installed: "
                          "pip install 'torchfl[report]'") from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "path"      # no font files to fetch: text as paths
    matplotlib.rcParams["svg.hashsalt"] = "torchfl"   # deterministic ids
    import matplotlib.pyplot as plt

    return plt


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    _plt().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _family(step) -> str:
    from torchfl.kernels.catalog import CATALOG

    if step.kind == "fallback":
        return "CPU fallback"
    if step.kind == "fold":
        return "host fold"
    spec = CATALOG.get(step.kernel)
    return spec.family if spec is not None else str(step.kernel)


def _colours(plan) -> dict:
    families = sorted({_family(s) for s in plan.steps} - {"CPU fallback", "host fold"})
    out = {f: _FAMILY_COLOURS[i % len(_FAMILY_COLOURS)] for i, f in enumerate(families)}
    out.update({"CPU fallback": FALLBACK, "host fold": FOLD})
    return out


def graph_figure(plan) -> str:
    """The plan's steps as a layered graph (producer -> consumer), coloured by family."""
    import networkx as nx

    plt = _plt()
    g = nx.DiGraph()
    shown = [s for s in plan.steps if not (s.static and s.kind in ("cast", "layout"))]   # weight prep: once
    for s in shown:
        g.add_node(s.index)
    for s in shown:
        for v in s.inputs:
            src = plan.values[v].producer if v and v in plan.values else None
            if src is not None and src in g:
                g.add_edge(src, s.index)
    for layer, nodes in enumerate(nx.topological_generations(g)):
        for n in nodes:
            g.nodes[n]["layer"] = layer
    pos = nx.multipartite_layout(g, subset_key="layer", align="horizontal", scale=1.0)
    pos = {n: (x, -y) for n, (x, y) in pos.items()}     # layer 0 at the top
    depth = 1 + max((d["layer"] for _n, d in g.nodes(data=True)), default=0)
    width = max((len(list(nodes)) for nodes in nx.topological_generations(g)), default=1)
    fig, ax = plt.subplots(figsize=(min(16, 4 + 0.6 * width), min(40, 2 + 0.28 * depth)))
    colours = _colours(plan)
    node_colours = [colours[_family(plan.steps[n])] for n in g.nodes]
    nx.draw_networkx_edges(g, pos, ax=ax, arrows=False, width=0.6, edge_color="#888888")
    nx.draw_networkx_nodes(g, pos, ax=ax, node_color=node_colours, node_size=70, linewidths=0.4,
                           edgecolors="#333333")
    if len(shown) <= 80:
        labels = {n: plan.steps[n].kernel or plan.steps[n].kind for n in g.nodes}
        nx.draw_networkx_labels(g, {n: (x + 0.02, y) for n, (x, y) in pos.items()}, labels, ax=ax, font_size=6,
                                horizontalalignment="left")
    from matplotlib.patches import Patch

    used = sorted({_family(s) for s in plan.steps})
    ax.legend(handles=[Patch(color=colours[f], label=f) for f in used], loc="upper left", bbox_to_anchor=(1, 1),
              fontsize=7, title="kernel family", title_fontsize=8)
    ax.set_title(f"plan graph: {len(shown)} steps on {plan.chip} (data flows downward; "
                 f"{len(plan.steps) - len(shown)} static weight casts/layouts not drawn)", fontsize=9)
    ax.axis("off")
    return _svg(fig)


def roofline_figure(plan, chip_model) -> str:
    """Chip steps against the compute ceilings and the bandwidth slope (log-log)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colours = _colours(plan)
    bw = chip_model.offchip_bw
    pts = {}
    for s in plan.steps:
        if s.kind in ("fallback", "fold") or s.predicted_time_s <= 0 or s.predicted_bytes <= 0 or s.predicted_flops <= 0:
            continue
        pts.setdefault(_family(s), []).append((s.predicted_flops / s.predicted_bytes,
                                               s.predicted_flops / s.predicted_time_s))
    xs = [x for v in pts.values() for x, _ in v] or [1.0]
    lo, hi = min(xs) / 4, max(xs) * 4
    peaks = sorted({(d, chip_model.peak_for(d)) for d in {s.dtype for s in plan.steps if s.kind != "fallback"}
                    if d in chip_model.peak}, key=lambda t: t[1])
    import numpy as np

    grid = np.logspace(np.log10(lo), np.log10(hi), 100)
    for dtype, peak in peaks:
        ax.plot(grid, np.minimum(peak, bw * grid), lw=1.2, label=f"ceiling {dtype}: {peak / 1e12:.3g} Tops/s, "
                                                                  f"{bw / 1e9:.3g} GB/s")
    for fam, v in sorted(pts.items()):
        ax.scatter([x for x, _ in v], [y for _, y in v], s=14, color=colours.get(fam, "#333333"), label=fam,
                   edgecolors="#333333", linewidths=0.3, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("operations per off-chip byte (predicted)")
    ax.set_ylabel("operations per second (predicted)")
    ax.set_title(f"roofline of the plan's steps on {plan.chip}", fontsize=9)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1, 1))
    return _svg(fig)


def memory_figure(plan) -> str:
    """Bytes live at each step's high-water mark, stacked by buffer kind; peak and capacity."""
    return _svg(memory_fig(plan))


def memory_series(plan) -> tuple[list[int], dict]:
    """(steps -1..n-1, bytes live at each step per buffer kind): what the timeline draws."""
    from torchfl.planner.buffers import KINDS

    mp = plan.memory
    n = len(plan.steps)
    steps = list(range(-1, n))
    series = {k: [0] * len(steps) for k in KINDS}
    for b in mp.buffers:
        first = b.alloc
        last = n - 1 if b.free is None else min(b.free, n - 1)
        for i in range(max(first, -1), last + 1):
            series[b.kind][i + 1] += b.nbytes
    return steps, series


def memory_fig(plan):
    from torchfl.kernels.units import fmt_bytes
    from torchfl.planner.buffers import KINDS

    plt = _plt()
    mp = plan.memory
    steps, series = memory_series(plan)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    used = [k for k in KINDS if any(series[k])]
    scale = 1 << 20
    ax.stackplot(steps, *[[v / scale for v in series[k]] for k in used], labels=used,
                 colors=[_KIND_COLOURS[k] for k in used], step="mid", alpha=0.9)
    peak = mp.peak_bytes / scale
    top = max(mp.capacity or 0, mp.peak_bytes) / scale
    ax.set_ylim(0, max(top * 1.08, peak * 1.3))     # room above the peak for its label
    ax.axvline(mp.peak_step, color="#d62728", lw=1, ls="--")
    # the label sits above the peak, where no bar reaches (the stack is never higher than the peak)
    ax.annotate(f"peak {fmt_bytes(mp.peak_bytes)} " + ("(uploads)" if mp.peak_step < 0 else f"(step {mp.peak_step})"),
                (mp.peak_step, peak), xytext=(0, 6), textcoords="offset points", fontsize=7, color="#d62728",
                ha="left" if mp.peak_step < len(steps) / 2 else "right", va="bottom", gid="peak-label")
    if mp.capacity is not None:
        ax.axhline(mp.capacity / scale, color="black", lw=1)
        ax.annotate(f"capacity {fmt_bytes(mp.capacity)}", (0, mp.capacity / scale), fontsize=7,
                    xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel("step (-1: uploads before step 0)")
    ax.set_ylabel("device memory live (MiB)")
    ax.set_title(f"memory timeline on {plan.chip}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    ax.grid(True, lw=0.3, alpha=0.5)
    return fig


def compare_figure(rows) -> str:
    """Per-call time and peak memory per chip (chips that plan)."""
    return _svg(compare_fig(rows))


def compare_fig(rows):
    from matplotlib.patches import Patch

    plt = _plt()
    ok = [r for r in rows if r["ok"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 1.4 + 0.4 * max(1, len(ok))), layout="constrained")
    names = [f"{r['chip']} {r['version']}" for r in ok]
    a.barh(names, [r["per_call_time_s"] * 1e3 for r in ok], color=[_BOUND_COLOURS.get(r["bound"], "#bab0ac")
                                                                    for r in ok])
    a.set_title("per call (ms)", fontsize=9)
    a.invert_yaxis()
    shown = [b for b in _BOUND_COLOURS if any(r["bound"] == b for r in ok)]
    a.legend(handles=[Patch(color=_BOUND_COLOURS[b], label=f"{b}-bound") for b in shown], fontsize=7,
             loc="lower right")
    b.barh(names, [r["peak_bytes"] / (1 << 20) for r in ok], color="#59a14f")
    for i, r in enumerate(ok):
        if r["capacity_bytes"]:
            b.plot([r["capacity_bytes"] / (1 << 20)] * 2, [i - 0.4, i + 0.4], color="black", lw=1.5)
    b.set_xscale("log")
    b.set_title("peak device memory (MiB, log; black tick: capacity)", fontsize=9)
    b.invert_yaxis()
    b.set_yticks(range(len(ok)), [""] * len(ok))
    fig.suptitle("chips side by side", fontsize=9)
    return fig


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 1.5em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; } td, th { border: 1px solid #ddd; padding: 2px 6px; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.err td { color: #b00; } pre { font-size: 0.75em; overflow-x: auto; background: #fafafa; padding: 0.6em; }
figure { margin: 0.6em 0; } figure svg { max-width: 100%; height: auto; }
.meta { color: #555; font-size: 0.9em; } table.data { margin: 0.4em 0 1em; }
@media print { body { max-width: none; margin: 0; } pre { white-space: pre-wrap; overflow: visible; }
               figure, table.data tr { break-inside: avoid; } h2 { break-after: avoid; } }
"""


def _e(x) -> str:
    return html.escape(str(x))


def _table(header, rows, numeric=(), classes=None, table_id=None) -> str:
    ident = f' id="{table_id}"' if table_id else ""
    out = [f'<table class="data"{ident}><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr></thead><tbody>"]
    for i, r in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(f'<td class="num">{_e(c)}</td>' if j in numeric else f"<td>{_e(c)}</td>"
                                          for j, c in enumerate(r)) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _figure(fig_id: str, svg: str, caption: str) -> str:
    return f'<figure id="{fig_id}" class="figure">{svg}<figcaption class="meta">{_e(caption)}</figcaption></figure>'


def render_report(plan, chip_model, title: str, comparison: dict | None = None) -> str:
    """The HTML page for ``plan`` on ``chip_model`` (and, if given, the rows of a compare).
    Every figure has its numbers beside it as an HTML table (readable printed, searchable)."""
    from torchfl.planner.explain import confidence_line, memory_line
    from torchfl.kernels.units import fmt_bytes

    s = plan.summary
    parts = [f"<h1>{_e(title)}</h1>",
             f'<p class="meta">{_e(s.headline(plan.chip))}. Chip {_e(plan.chip)} {_e(plan.chip_version)}, precision '
             f'{_e(plan.precision or "as captured")}; per call {_e(_time(s.per_call_time_s))}, '
             f"{_e(fmt_bytes(int(s.per_call_bytes)))} off-chip; run once {_e(_time(s.run_once_time_s))}, "
             f"{_e(fmt_bytes(int(s.run_once_bytes)))} off-chip (parameter casts and layout copies kept on the chip). "
             f"{_e(memory_line(plan))}</p>"]
    trust = confidence_line(plan)
    if trust:
        parts.append(f'<p class="meta" id="confidence">{_e(trust)}</p>')
    if comparison is not None:
        rows, classes = [], []
        for r in comparison["rows"]:
            if r["ok"]:
                rows.append((r["chip"], r["version"], r["precision"] or "-", _time(r["per_call_time_s"]),
                             _assumed(r), _time(r["run_once_time_s"]), fmt_bytes(r["per_call_bytes"]), fmt_bytes(r["peak_bytes"]),
                             fmt_bytes(r["capacity_bytes"]) if r["capacity_bytes"] else "unbounded", r["kernels"],
                             r["fused_groups"], r["conversions"], r["fallbacks"],
                             f"{r['bound']} ({100 * r['bound_share']:.0f}%)"))
                classes.append("")
            else:
                rows.append((r["chip"], r["version"], r["precision"] or "-", f"{r['error_kind']}: {r['error']}",
                             "", "", "", "", "", "", "", "", "", ""))
                classes.append("err")
        parts += ["<h2>Chips side by side</h2>",
                  _figure("fig-compare", compare_figure(comparison["rows"]),
                          "Per-call time and peak device memory per chip, from the plans (nothing ran); the table "
                          "has the numbers."),
                  _table(("chip", "version", "precision", "per call", "confidence", "run once", "off-chip per call",
                          "peak memory", "capacity", "kernels", "fused", "layout conversions", "fallbacks", "bound by"),
                         rows, numeric=(3, 5, 6, 7, 8, 9, 10, 11, 12), classes=classes, table_id="tab-compare")]
        if comparison.get("rank_rule") and any("rank_time_s" in r for r in comparison["rows"]):
            parts.append(f'<p class="meta">Order: {_e(comparison["rank_rule"])}: ' + _e(", ".join(
                f"{r['chip']} as {_time(r['rank_time_s'])}" for r in comparison["rows"] if "rank_time_s" in r))
                + ".</p>")
    parts += [f"<h2>The plan on {_e(plan.chip)}</h2>",
              _figure("fig-graph", graph_figure(plan),
                      "Each dot is a step; colour is the kernel family (red: CPU fallback, grey: folded on the host)."),
              _family_table(plan),
              "<h2>Roofline</h2>",
              _figure("fig-roofline", roofline_figure(plan, chip_model),
                      "Each chip step at its predicted operations per off-chip byte and operations per second, under "
                      "the chip's ceilings (min of the unit's peak and bandwidth x intensity)."),
              _roofline_table(plan, chip_model),
              "<h2>Device memory</h2>",
              _figure("fig-memory", memory_figure(plan), memory_line(plan)),
              _memory_table(plan),
              "<h2>Explain</h2>",
              f"<pre>{_e(plan.explain('text', width=100))}</pre>"]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>\n" + "\n".join(parts)
            + "\n</body></html>\n")


def _time(s: float) -> str:
    from torchfl.planner.texttable import human_time

    return human_time(s)


def _family_table(plan) -> str:
    """Steps, per-call time and bytes per kernel family (the graph's colours, as numbers)."""
    from torchfl.kernels.units import fmt_bytes

    fam: dict = {}
    for st in plan.steps:
        f = fam.setdefault(_family(st), [0, 0, 0.0, 0.0, 0.0])
        f[0 if not st.static else 1] += 1
        if st.static:
            f[4] += st.predicted_time_s
        else:
            f[2] += st.predicted_time_s
            f[3] += st.predicted_bytes
    rows = [(k, v[0], v[1], _time(v[2]), fmt_bytes(int(v[3])), _time(v[4]))
            for k, v in sorted(fam.items(), key=lambda kv: -kv[1][2])]
    return _table(("kernel family", "steps per call", "steps run once", "per call", "off-chip per call", "run once"),
                  rows, numeric=(1, 2, 3, 4, 5), table_id="tab-families")


def _assumed(r) -> str:
    """A compare row's confidence in the page's words."""
    c = r.get("confidence")
    if not c:
        return "-"
    from torchfl.planner.confidence import Confidence

    conf = Confidence.from_dict(c)
    text = f"{conf.assumption_share:.0%} assumed; {conf.checked_text()}"
    return text + (f"; not stated: {', '.join(conf.missing)}" if conf.missing else "")


def _roofline_table(plan, chip_model) -> str:
    """The roofline's points: each chip step's intensity, rate and what bounds it (the larger of
    its launch and the term that bound its body, :mod:`torchfl.planner.terms`)."""
    from torchfl.planner.terms import step_terms
    from torchfl.planner.whatif.compare import BOUND_WORDS

    rows = []
    for st in plan.steps:
        if st.kind in ("fallback", "fold") or st.predicted_time_s <= 0 or st.predicted_bytes <= 0 \
                or st.predicted_flops <= 0:
            continue
        t = step_terms(st, plan, chip_model)
        bound = "launch" if t.launch_s > t.body_s else BOUND_WORDS.get(t.bound, t.bound)
        rows.append((st.index, st.kernel, _family(st), st.dtype, f"{st.predicted_flops / st.predicted_bytes:.3g}",
                     f"{st.predicted_flops / st.predicted_time_s / 1e9:.3g}", _time(st.predicted_time_s),
                     bound, "run once" if st.static else "per call"))
    return _table(("step", "kernel", "family", "dtype", "ops per byte", "Gops/s", "time", "bound by", "runs"),
                  rows, numeric=(0, 4, 5, 6), table_id="tab-roofline")


def _memory_table(plan) -> str:
    """The timeline's numbers: the peak by buffer kind and the largest buffers live then."""
    from torchfl.kernels.units import fmt_bytes
    from torchfl.planner.buffers import WHY

    mp = plan.memory
    kinds = [(k, fmt_bytes(n), f"{n:,}", WHY.get(k, "")) for k, n in mp.breakdown().items() if n]
    kinds.append(("total at peak", fmt_bytes(mp.peak_bytes), f"{mp.peak_bytes:,}",
                  "uploads" if mp.peak_step < 0 else f"step {mp.peak_step}"))
    top = [(b.name, b.kind, fmt_bytes(b.nbytes), "before step 0" if b.alloc < 0 else f"step {b.alloc}",
            "kept" if b.free is None else f"after step {b.free}") for b in mp.live_at_peak()[:10]]
    return (_table(("live at peak", "size", "bytes", "what"), kinds, numeric=(1, 2), table_id="tab-memory")
            + _table(("largest buffers at peak", "kind", "size", "allocated", "freed"), top, numeric=(2,),
                     table_id="tab-buffers"))
