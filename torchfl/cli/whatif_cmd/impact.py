"""``torchfl plan impact``: what a new version of a chip changes for a model set."""

from __future__ import annotations

import json
import sys

import click

from torchfl.cli.whatif_cmd.common import (common_options, emit_json, fail, guarded, impact_status, load, para,
                                            precision_of, progress_notes, show_bytes, show_time, swept)
from torchfl.cluster.options import cluster_option, require_ray, resume_option


@click.command("impact")
@click.option("--chip", required=True, help="Chip name in the registry.")
@click.option("--from", "v1", required=True, help="The version in use (e.g. 1.0.0).")
@click.option("--to", "v2", required=True, help="The new version.")
@click.option("--models", default="zoo", show_default=True,
              help="zoo (every zoo model), or comma-separated zoo names / path/to/file.py:factory.")
@common_options
@cluster_option
@resume_option
@guarded
def impact(chip, v1, v2, models, precision, training, registry, as_json, cluster, resume):
    """Field diff of two versions of --chip, then each model re-planned on both: changed plans
    (kernels, layouts, tilings, fusions), cost and memory deltas, new fallbacks or errors.
    Exit status 1 when a model that planned on --from no longer plans on --to.
    With --cluster, each model is a unit on the Ray cluster, recorded in the registry (--resume RUN)."""
    from torchfl.planner import whatif
    from torchfl.planner.zoo import ZOO

    require_ray(cluster)
    specs = list(ZOO) if models.strip() == "zoo" else [m.strip() for m in models.split(",") if m.strip()]
    if not specs:
        fail("Error", f"--models {models!r} names no model; give zoo, or comma-separated zoo names / "
                       "path/to/file.py:factory", code=2)
    for version in (v1, v2):            # a version that does not exist is said before any model loads
        whatif.chip_of(chip, registry, version)
    if cluster is not None or resume is not None:
        from torchfl.cluster.whatif import check_model, sweep_impact

        for spec in specs:
            check_model(spec)
        res = swept(cluster, resume, registry, lambda **kw: sweep_impact(
            chip, v1, v2, specs, precision=precision_of(precision), training=training, **kw))
    else:
        loaded = [(spec, *load(spec)) for spec in specs]
        res = whatif.impact(chip, v1, v2, loaded, registry, precision_of(precision), training,
                            progress=None if as_json else progress_notes("impact"))
    if as_json:
        emit_json(res.to_dict())
    else:
        click.echo(_impact_text(res))
    if res.broken:
        sys.exit(1)


def _assumed(r) -> str:
    c = r.get("confidence")
    return "-" if not c else f"{100 * c['assumption_share']:.0f}%" + ("!" if c["missing"] else "")


def _impact_text(res) -> str:
    out = [f"{res.chip} {res.v1} -> {res.v2}: {len(res.changes)} field change(s)"]
    for c in res.changes:
        old = json.dumps(c.get("old")) if "old" in c else ""
        new = json.dumps(c.get("new")) if "new" in c else ""
        out += para(f"{c['kind']:7}  {c['path']}: {old}{' -> ' if old and new else ''}{new}", indent="  ",
                     subsequent="           ")
    for m in res.models:
        b, a = m.before, m.after
        out.append("")
        status = impact_status(m)
        if status == "plans on neither":
            out += para(f"{m.model}: {status} ({a['error_kind']}: {a['error'].splitlines()[0]})")
            continue
        if status == "BROKEN":
            out += para(f"{m.model}: {status}: planned on {res.v1}, refused on {res.v2}: {a['error_kind']}: "
                         f"{a['error'].splitlines()[0]}")
            continue
        if status == "newly plannable":
            out += para(f"{m.model}: {status} on {res.v2} (on {res.v1}: {b['error_kind']}: "
                         f"{b['error'].splitlines()[0]})")
            continue
        dt = a["per_call_time_s"] - b["per_call_time_s"]
        pct = 100 * dt / b["per_call_time_s"] if b["per_call_time_s"] else 0.0
        out += para(f"{m.model}: {status}: per call {show_time(b['per_call_time_s'])} -> {show_time(a['per_call_time_s'])} "
                     f"({pct:+.1f}%), run once {show_time(b['run_once_time_s'])} -> {show_time(a['run_once_time_s'])}, "
                     f"off-chip per call {show_bytes(b['per_call_bytes'])} -> {show_bytes(a['per_call_bytes'])}, peak memory "
                     f"{show_bytes(b['peak_bytes'])} -> {show_bytes(a['peak_bytes'])}, fallbacks {b['fallbacks']} -> "
                     f"{a['fallbacks']}, {len(m.changed_steps)} op group(s) planned differently; "
                     f"{_assumed(b)} -> {_assumed(a)} of the time priced from assumed or unstated numbers")
        for c in m.changed_steps[:12]:
            what = "; ".join(f"{k} {x} -> {y}" for k, (x, y) in c["changed"].items())
            out += para(f"{c['nodes']}: {what}", indent="    ", subsequent="      ")
        if len(m.changed_steps) > 12:
            out.append(f"    ... and {len(m.changed_steps) - 12} more (--json lists all)")
        for f in m.new_fallbacks:
            out += para(f"new fallback: {f['node']} ({f['op']}): {f['reason']}", indent="    ", subsequent="      ")
        for g in m.fusions_lost:
            out += para(f"fusion lost: {g}", indent="    ", subsequent="      ")
    if any(m.before.get("confidence") and m.after.get("confidence") for m in res.models):
        out.append("")
        out += para("assumed = share of the per-call time priced from numbers of kind assumption or unstated (HCD "
                    "provenance); ! = a number the chip's file leaves out, priced as nothing (--json lists them)")
    if res.broken:
        out.append("")
        out += para(f"BROKEN on {res.v2}: {', '.join(res.broken)} (exit status 1)")
    return "\n".join(out)
