"""``torchfl hcd``: validate HCD files, print the JSON Schema, show the canonical form.

Exit codes of ``validate``: 0 all valid, 1 any invalid, 2 any unreadable (2 wins).
"""

from __future__ import annotations

import json
import sys

import click

# torchfl.hcd (pydantic models) is imported inside the commands: ``torchfl --help`` stays fast.


@click.group()
def hcd() -> None:
    """Hardware Capability Descriptor files."""


@hcd.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of diagnostics.")
@click.option("--quiet", "-q", is_flag=True, help="Print errors only, no warnings or summary.")
def validate(files: tuple[str, ...], as_json: bool, quiet: bool) -> None:
    """Validate HCD FILES; report every problem with file:line:column."""
    from torchfl.hcd import check_hcd

    reports = [check_hcd(f) for f in files]
    diagnostics = [d for r in reports for d in r.diagnostics]
    if as_json:
        click.echo(json.dumps([d.as_dict() for d in diagnostics], indent=2))
    else:
        for d in diagnostics:
            if quiet and d.severity != "error":
                continue
            click.echo(str(d), err=d.severity == "error")
        if not quiet:
            for r in reports:
                if r.ok:
                    h = r.hcd
                    n_warn = len(r.diagnostics)
                    extra = f" ({n_warn} warning{'s' if n_warn != 1 else ''})" if n_warn else ""
                    click.echo(f"{r.file}: valid: {h.chip.name} {h.chip.version}{extra}")
                else:
                    n_err = sum(d.severity == "error" for d in r.diagnostics)
                    state = "unreadable" if not r.readable else f"invalid, {n_err} error{'s' if n_err != 1 else ''}"
                    click.echo(f"{r.file}: {state}", err=True)
    if any(not r.readable for r in reports):
        sys.exit(2)
    if any(not r.ok for r in reports):
        sys.exit(1)


@hcd.command()
def schema() -> None:
    """Print the JSON Schema (draft 2020-12) of the HCD format."""
    from torchfl.hcd.schema import hcd_json_schema

    click.echo(json.dumps(hcd_json_schema(), indent=2))


@hcd.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the canonical form as JSON.")
def show(file: str, as_json: bool) -> None:
    """Show the canonical, unit-normalised form of an HCD FILE."""
    from torchfl.hcd import check_hcd

    report = check_hcd(file)
    if not report.ok:
        for d in report.diagnostics:
            click.echo(str(d), err=True)
        sys.exit(2 if not report.readable else 1)
    h = report.hcd
    if as_json:
        click.echo(json.dumps({**h.canonical(), "format_version": h.format_version,
                               "content_hash": h.content_hash()}, indent=2))
        return
    from torchfl.cli.render import hcd_table

    hcd_table(h)
