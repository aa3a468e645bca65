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


def _dtype_layouts(row) -> str:
    """``float16, bfloat16 in NCHW, NHWC; int8 in NHWC``: each dtype with its own unit's
    layouts (dtypes sharing the same layouts grouped), ``(layout-free)`` for ops without."""
    groups: dict = {}
    for d, lays in row["layouts_by_dtype"].items():
        groups.setdefault(frozenset(lays), (lays, []))[1].append(d)
    return "; ".join(f"{', '.join(ds)} in {', '.join(lays)}" if lays else f"{', '.join(ds)} (layout-free)"
                     for lays, ds in groups.values())


def _para(text: str) -> list[str]:
    """An indented item that wraps at spaces to the terminal (100 columns in a pipe)."""
    from torchfl.planner.texttable import paragraph

    return paragraph(text, indent="  ", subsequent="      ")


def _columns(rows, indent: int = 2) -> list[str]:
    """Rows of cells (the first row is the header) as aligned lines that fit the terminal
    (100 columns in a pipe) after ``indent``: long cells wrap at spaces, never cut."""
    from torchfl.planner.texttable import table, terminal_width

    if not rows:
        return []
    return table(rows[0], rows[1:], width=terminal_width() - indent)


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
    rows = [("op", "kernel(s)", "evidence", "dtypes and their layouts")] + \
        [(o["op"], ", ".join(o["kernels"]), short(o["evidence"], brief=True), _dtype_layouts(o))
         for o in result["ops"]]
    for line in _columns(rows):
        click.echo("  " + line)
    fus = [f for f in result["fusions"] if f["supported"]]
    if fus:
        click.echo("fusion groups:")
        for f in fus:
            chain = " -> ".join("|".join(s) for s in f["pattern"])
            click.echo("\n".join(_para(f"{f['name']} -> {f['kernel']}: {chain}")))
    from torchfl.rules.support import decompositions_on

    packs = _packs(reg)
    for u in result["unsupported"]:
        why = u["reasons"][0]["message"] if u["reasons"] else "no rule serves it"
        decs = decompositions_on(u["op"], hcd, packs)
        if decs:   # the answer `registry why-not` gives, in its words: served, through the decomposition
            click.echo("\n".join(_para(f"not supported directly: {u['op']}: {why}; "
                                        + "; or ".join(_decomposition_text(d, guards=False) for d in decs))))
        else:
            click.echo("\n".join(_para(f"not supported: {u['op']}: {why}")))
    missing: dict = {}                 # one line per reason: the fusions that need what the chip lacks
    for f in result["fusions"]:
        if not f["supported"]:
            missing.setdefault(f["reasons"][0]["message"], []).append(f["name"])
    for why, names in missing.items():
        click.echo("\n".join(_para(f"fusion groups not available: {', '.join(names)} ({why})")))
    from torchfl.planner.texttable import paragraph

    no_rule = sorted(u["op"] if isinstance(u, dict) else str(u) for u in result["no_rule"])
    click.echo("\n".join(paragraph(
        f"{len(result['ops'])} ops supported, {len(result['unsupported'])} with rules not supported, "
        f"{len(no_rule)} known ops without a rule (see `registry why-not OP --chip`)" + (":" if no_rule else ""))))
    if no_rule:
        click.echo("\n".join(paragraph(", ".join(no_rule), indent="  ", subsequent="  ")))
    states: dict = {}
    for o in result["ops"]:
        states[o["evidence"]["state"]] = states.get(o["evidence"]["state"], 0) + 1
    click.echo("\n".join(paragraph("evidence: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
                                   + " (`torchfl conformance --chip NAME` runs OpInfo samples and records verdicts)")))


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
    rows = [("chip", "kernel(s)", "dtypes and their layouts")]
    for row in result["chips"]:
        c = row["chip"]
        name = f"{c['name']} {c['version']}"
        if row["supported"]:
            rows.append((name, ", ".join(row["kernels"]), _dtype_layouts(row)))
            rows.append(("", "", f"evidence: {short(row['evidence'])}"))
            rows += [("", "", line) for line in _problems(row["evidence"])]
        else:
            rows.append((name, "-", f"not supported: {row['reasons'][0]['message']}"))
    for line in _columns(rows):
        click.echo("  " + line)


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
    from torchfl.registry.evidence import describe

    result = query(op, hcd, packs, dtype=dtype, layout=layout, known_layouts=others)
    if not result["supported"] and result["dtype"]:
        result["root_cause"] = chip_lacks(hcd, result["dtype"])
    rows = _evidence(reg, hcd, result["op"]).get(result["op"], [])
    if result["dtype"]:
        rows = [e for e in rows if e.dtype == result["dtype"]]
    result["evidence"] = describe(rows)
    if as_json:
        return _emit_json(result)
    from torchfl.planner.texttable import paragraph

    for line in _why_not_lines(result):     # each wrapped at spaces under its own indent
        indent = " " * (len(line) - len(line.lstrip()))
        click.echo("\n".join(paragraph(line.lstrip(), indent=indent, subsequent=indent + "    ")))


def _why_not_lines(result) -> list[str]:
    """A supported combination in one line; otherwise what is served (per dtype, with its
    layouts), each rule's call guards once, and every gap with its reasons."""
    from torchfl.registry.evidence import short

    c = result["chip"]
    asked = " ".join(x for x in (result["dtype"], result["layout"]) if x)
    head = f"{result['op']}{' ' + asked if asked else ''} on {c['name']} {c['version']}"
    served, gaps = result["served"], result["gaps"]
    rules: dict = {}                 # rule -> (kernel, guards, {unit: [dtypes]})
    for s in served:
        units = rules.setdefault(s["rule"], (s["kernel"], s["guards"], {}))[2]
        dts = units.setdefault(f"compute_units.{s['unit'] or '-'}", [])
        if s["dtype"] not in dts:
            dts.append(s["dtype"])
    warnings = list(dict.fromkeys(w for s in served for w in s["warnings"]))

    def on(units: dict) -> str:
        if len(units) == 1:
            return next(iter(units))
        return ", ".join(f"{u} ({', '.join(ds)})" for u, ds in units.items())

    if result["supported"] and not gaps:
        how = "; ".join(f"{kernel} on {on(units)} ({rule}"
                        + (f"; the call must meet its {len(guards)} guard(s), --json lists them" if guards else "")
                        + ")" for rule, (kernel, guards, units) in rules.items())
        scope = "" if asked else f" in {_dtype_layouts({'layouts_by_dtype': _layouts_by_dtype(served)})}"
        ev = f"; evidence: {short(result['evidence'])}" if "evidence" in result else ""
        return [f"{head}: supported{scope}, by {how}{ev}"] + [f"  warning: {w}" for w in warnings]
    decs = result.get("decompositions", ())
    verdict = ("supported" if result["supported"] else
               "not supported directly" if decs and not result.get("root_cause") else "not supported")
    lines = [f"{head}: {verdict}"]
    if result.get("root_cause"):
        lines.append(f"  root cause: {result['root_cause']}")
    if served:
        lines.append(f"  served: {_dtype_layouts({'layouts_by_dtype': _layouts_by_dtype(served)})}")
        for rule, (kernel, guards, units) in rules.items():
            lines.append(f"    by {kernel} on {on(units)} ({rule})")
            if guards:
                lines.append(f"      if the call meets: {'; '.join(guards)}")
        lines += [f"    warning: {w}" for w in warnings]
    for g in gaps:
        what = " ".join(x for x in (g["dtype"], g["layout"]) if x) or "any"
        lines += [f"  not {what}: {r['message']}" for r in g["reasons"]]
    if result.get("root_cause") and decs:
        lines.append(f"  no decomposition helps: its parts would compute in {result['dtype']} too")
    else:
        lines += [f"  {_decomposition_text(d)}" for d in decs]
    if served and "evidence" in result:
        lines.append(f"  evidence: {short(result['evidence'])}")
        lines += [f"    {line}" for line in _problems(result["evidence"])]
    return lines


def _decomposition_text(d: dict, guards: bool = True) -> str:
    """How a decomposition serves an op, told the same way by `registry ops` and `why-not`;
    its condition before its parts (one for unbatched inputs only must not read as general)."""
    parts = ", ".join(p.removeprefix("aten.").rsplit(".", 1)[0] for p in d["parts"])
    when = ""
    if d["guards"]:
        when = (f", only for calls that meet: {'; '.join(d['guards'])}," if guards else
                f", only for calls that meet its {len(d['guards'])} guard(s) (`registry why-not` lists them),")
    return (f"decomposed by {d['rule']}{when} into {parts} (each part by its own rule, planned when cheaper "
            "than a direct kernel, or when none takes the call)")


def chip_lacks(hcd, dtype: str) -> str | None:
    """The root cause when the chip cannot compute ``dtype`` at all (no compute unit runs it):
    said before any rule's dtype list, which would otherwise read as the reason. None when a
    unit runs it, or for the integer and bool dtypes of the index path (no unit needed)."""
    from torchfl.hcd.dtypes import UNIT_OF_DTYPE, unit_label

    if dtype not in UNIT_OF_DTYPE or hcd.unit_for(dtype) is not None:
        return None
    units = [u for u in ("fp16", "bf16", "fp32", "int8") if getattr(hcd.compute_units, u, None) is not None]
    stored = "" if dtype in hcd.stored_dtypes else f", and tensor.supported_dtypes lists no {dtype}"
    return (f"{hcd.name} {hcd.version} has no {dtype}: compute_units.{unit_label(dtype)} is absent (its units: "
            f"{', '.join(units) or 'none'}){stored}; no rule or decomposition can run {dtype} on it")


def _problems(desc: dict) -> list[str]:
    """The verdicts behind a claim that is not simply verified: how it fails, or why it was refused."""
    out = []
    for p in desc.get("problems", []):
        head = (f"{p['dtype']} {p['layout']}: {p['verdict']} ({p['samples'] - p['failed'] - p['refused']}/"
                f"{p['samples']} pass, {p['failed']} fail, {p['refused']} refused)")
        lines = [ln.strip() for ln in (p["reason"] or "").splitlines() if ln.strip()]
        why = lines[1] if len(lines) > 1 and lines[0].startswith("strict") else (lines[0] if lines else "")
        out.append(f"{head}{': ' + why if why else ''}")
    return out


def _layouts_by_dtype(served) -> dict:
    out: dict = {}
    for s in served:
        lays = out.setdefault(s["dtype"], [])
        if s["layout"] and s["layout"] not in lays:
            lays.append(s["layout"])
    return out


@click.command("routes")
@click.option("--chip", "chip_name", required=True, metavar="NAME", help="Chip name, e.g. NPU-V3.")
@click.option("--model", default=None, metavar="M", help="Only runs of this model (as given to plan explain).")
@registry_option
@json_option
@handles_errors
def routes(chip_name, model, registry_url, as_json):
    """Recorded route counts of model runs on a chip (plan explain --analyze --record), newest first:
    per ATen op, how many nodes ran on which kernel, were folded, or fell back to the CPU."""
    reg = open_registry(registry_url)
    reg.record(chip_name)
    runs = reg.routes(chip_name, model=model)
    if as_json:
        return _emit_json(runs)
    if not runs:
        click.echo(f"no recorded runs on {chip_name}: run `torchfl plan explain MODEL --chip {chip_name} "
                   "--analyze --record`")
        return
    for r in runs:
        total = {}
        for counts in r["routes"].values():
            for route, n in counts.items():
                kind = "fallback" if "fallback" in route else ("fold" if "fold" in route else "kernel")
                total[kind] = total.get(kind, 0) + n
        click.echo(f"run {r['run']} {r['recorded_at'][:19]} {r['model']} on {r['chip']} {r['chip_version']} "
                   f"({r['precision'] or 'as captured'}): " + ", ".join(f"{total.get(k, 0)} {k}"
                                                                       for k in ("kernel", "fold", "fallback")))
        rows = [(op, ", ".join(f"{n} x {route}" for route, n in sorted(c.items(), key=lambda kv: -kv[1])))
                for op, c in sorted(r["routes"].items())]
        for line in _columns(rows):
            click.echo("  " + line)


COMMANDS = [ops, support, why_not, routes]
