"""``torchfl system``: validate, import, list, show and trace the history of system descriptors
(``*.system.yaml``, torchfl/hcd/system.py), a thin face over the registry.

Exit codes as ``torchfl hcd validate`` / ``torchfl registry``: 0 fine, 1 content refused
(invalid file, unknown chip, immutable version), 2 unreadable file or unusable registry.
"""

from __future__ import annotations

import json
import sys

import click

from torchfl.cli.registry_cmd import (_emit_json, _print_table, _when, handles_errors, json_option, open_registry,
                                      print_history, registry_option)


@click.group("system")
def system() -> None:
    """System descriptors: N chips of one HCD, their topology and host links (*.system.yaml)."""


def _catalog(registry_url, offline: bool):
    if offline:
        return None
    return open_registry(registry_url).chip_catalog()


@system.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--offline", is_flag=True, help="Do not check the chip against the registry.")
@registry_option
@json_option
@handles_errors
def validate_cmd(files, offline, registry_url, as_json):
    """Validate system FILES (and that each one's chip is in the registry); every problem at
    file:line:column."""
    from torchfl.hcd.system import check_system

    catalog = _catalog(registry_url, offline)
    reports = [check_system(f, catalog) for f in files]
    diagnostics = [d for r in reports for d in r.diagnostics]
    if as_json:
        _emit_json([d.as_dict() for d in diagnostics])
    else:
        for d in diagnostics:
            click.echo(str(d), err=d.severity == "error")
        for r in reports:
            if r.ok:
                n = len(r.diagnostics)
                extra = f" ({n} warning{'s' if n != 1 else ''})" if n else ""
                click.echo(f"{r.file}: valid: {r.system.name} {r.system.version}{extra}")
            else:
                n = sum(d.severity == "error" for d in r.diagnostics)
                click.echo(f"{r.file}: {'unreadable' if not r.readable else f'invalid, {n} error' + 's' * (n != 1)}",
                           err=True)
    if any(not r.readable for r in reports):
        sys.exit(2)
    if any(not r.ok for r in reports):
        sys.exit(1)


@system.command("schema")
def schema_cmd():
    """Print the JSON Schema (draft 2020-12) of the system format."""
    from torchfl.hcd.system import system_json_schema

    click.echo(json.dumps(system_json_schema(), indent=2))


@system.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@registry_option
@json_option
@click.pass_context
def import_cmd(ctx, files, registry_url, as_json):
    """Import system FILES (with HCDs they need, if given too): all of them or none
    (the same import as `torchfl registry import`)."""
    from torchfl.cli.registry_cmd import import_cmd as registry_import

    ctx.invoke(registry_import, files=files, registry_url=registry_url, as_json=as_json)


@system.command("list")
@registry_option
@json_option
@handles_errors
def list_cmd(registry_url, as_json):
    """Systems with their latest version and chips."""
    reg = open_registry(registry_url)
    systems = reg.systems()
    if as_json:
        return _emit_json({"url": reg.display_url, "systems": [s.as_dict() for s in systems]})
    _print_table(f"systems in {reg.display_url}", ("system", "latest", "versions", "chips", "imported"),
                 [(s.name, s.latest, len(s.versions), f"{s.count}x {s.chip}" + (f" {s.chip_version}" if s.chip_version
                                                                                  else ""), _when(s.imported_at))
                  for s in systems])


@system.command("show")
@click.argument("name", metavar="NAME|FILE")
@click.option("--version", "version", default=None, metavar="V", help="A published version (default: latest).")
@registry_option
@json_option
@handles_errors
def show_cmd(name, version, registry_url, as_json):
    """A system (published NAME, or a FILE): its canonical form and every link number the planner
    prices for it, with whose file states it (the system's or the chip's) and its source's kind."""
    import yaml

    from torchfl.hcd import HCDError
    from torchfl.registry.systems import load_system_spec

    reg = open_registry(registry_url)
    try:
        sysd = load_system_spec(reg, name if version is None else f"{name}@{version}")
    except HCDError as exc:
        for d in exc.diagnostics:
            click.echo(str(d), err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"error: {name}: {exc}", err=True)
        sys.exit(2)
    hcd = reg.chip(sysd.chips.name, sysd.chips.version)
    try:
        links = sysd.link_numbers(hcd)
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if as_json:
        return _emit_json({**sysd.canonical(), "content_hash": sysd.content_hash(),
                           "chip": {"name": hcd.chip.name, "version": hcd.chip.version},
                           "links": {p: {"value": v, "from": origin, "kind": kind}
                                     for p, (v, origin, kind) in links.items()}})
    click.echo(f"# {sysd.describe()} (chip {hcd.chip.name} {hcd.chip.version})")
    click.echo(f"# sha256:{sysd.content_hash()}")
    click.echo(yaml.safe_dump(sysd.canonical(), sort_keys=False, allow_unicode=True), nl=False)
    _print_table("link numbers the planner prices", ("number", "value", "stated by", "source kind"),
                 [(p, f"{v:g}", origin, kind) for p, (v, origin, kind) in links.items()])


@system.command("history")
@click.argument("name")
@registry_option
@json_option
@handles_errors
def history_cmd(name, registry_url, as_json):
    """Every published version of a system, oldest first (semver order), with import times."""
    print_history(name, "system", registry_url, as_json)


@system.command("diff")
@click.argument("name")
@click.argument("v1")
@click.argument("v2")
@registry_option
@json_option
@handles_errors
def diff_cmd(name, v1, v2, registry_url, as_json):
    """Field-level changes between two published versions of a system (dotted paths)."""
    reg = open_registry(registry_url)
    changes = reg.diff(name, v1, v2, kind="system")
    if as_json:
        return _emit_json({"url": reg.display_url, "name": name, "kind": "system", "from": v1, "to": v2,
                           "changes": [c.as_dict() for c in changes]})
    click.echo(f"system {name} {v1} -> {v2}: {len(changes)} change(s)")
    for c in changes:
        click.echo(str(c))


__all__ = ["system"]
