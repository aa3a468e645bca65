"""``torchfl registry ops|support|why-not``: the support matrix, read through the Registry.

Thin: the answers are computed by :mod:`torchfl.rules.support` (pure functions over HCDs
and rule packs); this module reads chips and packs from the registry, prints text or
``--json``, and turns unknown names into one line on stderr (exit 1) listing near
matches. Neither torch nor numba is imported.
"""

from __future__ import annotations

import click

from torchfl.cli.registry_cmd import _emit_json, _fail, handles_errors, json_option, open_registry, registry_option


def _packs(reg):
    from torchfl.rules import PackError

    packs = []
    for summary in sorted(reg.packs(), key=lambda s: s.name):
        try:
            packs.append(reg.pack(summary.name))
        except PackError as exc:
            _fail(f"rule pack {summary.name} {summary.latest} in {reg.display_url} no longer checks: "
                  f"{exc.diagnostics[0] if exc.diagnostics else exc}", 1)
    if not packs:
        _fail(f"no rule packs in {reg.display_url}: run `torchfl registry import rules/core.yaml`", 1)
    return packs


def _guarded(f):
    """SupportError (unknown op/dtype/layout) -> one line, exit 1."""
    import functools

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        from torchfl.rules.support import SupportError

        try:
            return f(*args, **kwargs)
        except SupportError as exc:
            _fail(str(exc), 1)

    return handles_errors(wrapper)


def _evidence(reg, hcd, op=None) -> dict:
    """(chip name, op) -> stored verdicts, stale unless they were made on this very chip version
    with the registry's current rule packs."""
    from torchfl.registry.evidence import mark_stale

    rows = reg.evidence(chip=hcd.chip.name, op=op)
    if not rows:
        return {}
    packs = reg.identity(hcd.chip.name, hcd.chip.version).packs
    rows = mark_stale(rows, {hcd.chip.name: (hcd.chip.version, hcd.content_hash(), packs)})
    out: dict = {}
    for e in rows:
        out.setdefault(e.op, []).append(e)
    return out


def _lays(xs) -> str:
    return ", ".join(xs) if xs else "n/a (layout-free)"


@click.command("ops")
@click.option("--chip", "chip_name", required=True, metavar="NAME", help="Chip name, e.g. NPU-V3.")
@click.option("--version", "chip_version", default=None, metavar="V", help="Chip version (default: latest).")
@registry_option
@json_option
@_guarded
def ops(chip_name, chip_version, registry_url, as_json):
    """Every op a chip supports: dtypes, layouts and kernels; and the fusion groups available."""
    from torchfl.rules.support import chip_ops

    reg = open_registry(registry_url)
    hcd = reg.chip(chip_name, chip_version)
    from torchfl.registry.evidence import describe, short

    result = chip_ops(hcd, _packs(reg))
    evidence = _evidence(reg, hcd)
    for o in result["ops"]:
        o["evidence"] = describe(evidence.get(o["op"], []))
    if as_json:
        return _emit_json(result)
    c = result["chip"]
    click.echo(f"{c['name']} {c['version']} (device_type {c['device_type']}), packs: {', '.join(result['packs'])}")
    width = max((len(o["op"]) for o in result["ops"]), default=10)
    for o in result["ops"]:
        click.echo(f"  {o['op']:<{width}}  {', '.join(o['kernels']):<28} dtypes {', '.join(o['dtypes']):<26} "
                   f"layouts {_lays(o['layouts']):<24} evidence: {short(o['evidence'])}")
    fus = [f for f in result["fusions"] if f["supported"]]
    if fus:
        click.echo("fusion groups:")
        for f in fus:
            chain = " -> ".join("|".join(s) for s in f["pattern"])
            click.echo(f"  {f['name']} -> {f['kernel']}: {chain}")
    for u in result["unsupported"]:
        click.echo(f"  not supported: {u['op']}: {u['reasons'][0]['message'] if u['reasons'] else ''}")
    for f in result["fusions"]:
        if not f["supported"]:
            click.echo(f"  fusion not available: {f['name']}: {f['reasons'][0]['message']}")
    click.echo(f"{len(result['ops'])} ops supported, {len(result['unsupported'])} with rules not supported, "
               f"{len(result['no_rule'])} known ops without a rule (see `registry why-not OP --chip`)")
    states: dict = {}
    for o in result["ops"]:
        states[o["evidence"]["state"]] = states.get(o["evidence"]["state"], 0) + 1
    click.echo("evidence: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
               + " (`torchfl conformance --chip NAME` runs OpInfo samples and records verdicts)")


@click.command("support")
@click.argument("op")
@registry_option
@json_option
@_guarded
def support(op, registry_url, as_json):
    """One op across every chip in the registry (dtypes, layouts, kernel)."""
    from torchfl.rules.support import op_support

    reg = open_registry(registry_url)
    packs = _packs(reg)
    chips = [reg.chip(s.name) for s in reg.chips()]
    if not chips:
        _fail(f"no chips in {reg.display_url}: run `torchfl registry import hcd_registry/*.hcd`", 1)
    from torchfl.registry.evidence import describe, short

    result = op_support(op, chips, packs)
    for row, hcd in zip(result["chips"], chips):
        row["evidence"] = describe(_evidence(reg, hcd, result["op"]).get(result["op"], []))
    if as_json:
        return _emit_json(result)
    click.echo(f"{result['op']} ({result['rules']} rule{'s' if result['rules'] != 1 else ''})")
    for row in result["chips"]:
        c = row["chip"]
        name = f"{c['name']} {c['version']}"
        if row["supported"]:
            click.echo(f"  {name:<20} {', '.join(row['kernels']):<28} dtypes {', '.join(row['dtypes']):<26} "
                       f"layouts {_lays(row['layouts'])}")
            click.echo(f"  {'':<20} evidence: {short(row['evidence'])}")
            _problems(row["evidence"], indent=24)
        else:
            click.echo(f"  {name:<20} not supported: {row['reasons'][0]['message']}")


@click.command("why-not")
@click.argument("op")
@click.option("--chip", "chip_name", required=True, metavar="NAME", help="Chip name, e.g. NPU-V2.")
@click.option("--version", "chip_version", default=None, metavar="V", help="Chip version (default: latest).")
@click.option("--dtype", default=None, metavar="D", help="dtype to ask about (float16, torch.bfloat16, ...).")
@click.option("--layout", default=None, metavar="L", help="Layout to ask about (NCHW, NHWC, NHCW, ...).")
@registry_option
@json_option
@_guarded
def why_not(op, chip_name, chip_version, dtype, layout, registry_url, as_json):
    """Why an op is not served on a chip (each reason names the HCD field or the rule and guard)."""
    from torchfl.rules.support import layouts_of, normalise_dtype, normalise_layout, why_not as query

    normalise_dtype(dtype), normalise_layout(layout)  # unknown names fail before the registry is read
    reg = open_registry(registry_url)
    hcd = reg.chip(chip_name, chip_version)
    packs = _packs(reg)
    others = layouts_of([reg.chip(s.name) for s in reg.chips()])
    from torchfl.registry.evidence import describe, short

    result = query(op, hcd, packs, dtype=dtype, layout=layout, known_layouts=others)
    rows = _evidence(reg, hcd, result["op"]).get(result["op"], [])
    if result["dtype"]:
        rows = [e for e in rows if e.dtype == result["dtype"]]
    result["evidence"] = describe(rows)
    if as_json:
        return _emit_json(result)
    c = result["chip"]
    asked = " ".join(x for x in (result["dtype"], result["layout"]) if x)
    click.echo(f"{result['op']}{' ' + asked if asked else ''} on {c['name']} {c['version']}: "
               f"{'supported' if result['supported'] else 'not supported'}")
    seen = set()
    for s in result["served"]:
        key = (s["kernel"], s["dtype"], s["rule"])
        if key in seen:
            continue
        seen.add(key)
        lays = [x["layout"] for x in result["served"] if (x["kernel"], x["dtype"], x["rule"]) == key and x["layout"]]
        where = f" in {', '.join(lays)}" if lays else ""
        cond = f"; if the call meets: {'; '.join(s['guards'])}" if s["guards"] else ""
        click.echo(f"  served: {s['dtype']}{where} by {s['kernel']} ({s['rule']}) on compute_units."
                   f"{s['unit'] or '-'}{cond}")
        for w in s["warnings"]:
            click.echo(f"    warning: {w}")
    for g in result["gaps"]:
        what = " ".join(x for x in (g["dtype"], g["layout"]) if x) or "any"
        for r in g["reasons"]:
            click.echo(f"  not {what}: {r['message']}")
    if result["served"]:
        click.echo(f"  evidence: {short(result['evidence'])}")
        _problems(result["evidence"], indent=4)


def _problems(desc: dict, indent: int) -> None:
    """The verdicts behind a claim that is not simply verified: how it fails, or why it was refused."""
    pad = " " * indent
    for p in desc.get("problems", []):
        head = (f"{p['dtype']} {p['layout']}: {p['verdict']} ({p['samples'] - p['failed'] - p['refused']}/"
                f"{p['samples']} pass, {p['failed']} fail, {p['refused']} refused)")
        lines = [ln.strip() for ln in (p["reason"] or "").splitlines() if ln.strip()]
        why = lines[1] if len(lines) > 1 and lines[0].startswith("strict") else (lines[0] if lines else "")
        click.echo(f"{pad}{head}{': ' + why[:200] if why else ''}")


COMMANDS = [ops, support, why_not]
