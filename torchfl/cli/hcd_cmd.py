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
@click.argument("file", metavar="FILE|CHIP")
@click.option("--json", "as_json", is_flag=True, help="Print the canonical form as JSON.")
@click.option("--registry", default=None, help="Registry URL for a CHIP name (default: TORCHFL_REGISTRY_URL "
                                               "or the user's).")
def show(file: str, as_json: bool, registry: str | None) -> None:
    """Show the canonical, unit-normalised form of an HCD FILE, or of a CHIP in the registry,
    with the source (kind and reference) of every performance number."""
    h = _shown_hcd(file, registry)
    if as_json:
        numbers = {path: {"value": value, "kind": h.kind_of(path), "source": h.provenance.get(path)}
                   for path, value in h.performance_numbers().items()}
        click.echo(json.dumps({**h.canonical(), "format_version": h.format_version,
                               "content_hash": h.content_hash(), "performance_numbers": numbers}, indent=2))
        return
    from torchfl.cli.render import hcd_table

    hcd_table(h)


def _shown_hcd(file: str, registry: str | None):
    """The HCD of ``file`` when it names a file (exit 1/2 on bad input), else the registry's chip."""
    import os

    from torchfl.hcd import check_hcd

    if os.path.exists(file) or os.sep in file or file.endswith((".hcd", ".yaml", ".yml")):
        report = check_hcd(file)
        if not report.ok:
            for d in report.diagnostics:
                click.echo(str(d), err=True)
            sys.exit(2 if not report.readable else 1)
        return report.hcd
    from torchfl.registry import Registry, RegistryError

    try:
        with Registry(registry) as reg:
            return reg.chip(file)
    except RegistryError as exc:
        click.echo(f"error: {file!r} is neither an HCD file nor a chip in the registry: {exc}", err=True)
        sys.exit(2)


@hcd.command()
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False), default=None,
              help="Write the HCD here (default: print it).")
@click.option("--device", default="cpu", show_default=True, help="What to measure: cpu (this host) or cuda.")
@click.option("--threads", type=int, default=None,
              help="torch threads while measuring, 1 to this host's CPUs (default: 1, timed by its CPU time).")
@click.option("--timer", type=click.Choice(["wall", "cpu"]), default=None,
              help="wall clock, or one thread's CPU time (steady on a busy machine; needs --threads 1). "
                   "Default: cpu for one CPU thread, else wall.")
@click.option("--name", default=None, help="Chip name (default: HOST-<cpu model>).")
@click.option("--quick", is_flag=True, help="Smaller sizes, fewer runs (a few seconds).")
def probe(output, device, threads, timer, name, quick) -> None:
    """Measure this machine through torch and write an HCD of it (each figure's spread in a comment)."""
    from torchfl.cli.files import OutputError, write_atomically, writable_output
    from torchfl.cli.progress import Progress
    from torchfl.fidelity.probe import ProbeError, probe as run_probe
    from torchfl.hcd import HCDError

    from torchfl.fidelity.probe import check_name, check_options

    try:
        check_name(name)                     # every option checked before the minutes of probing
        check_options(device, threads, timer)
        path = writable_output(output, "host.hcd") if output else None
    except (OutputError, ProbeError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    try:
        with Progress(sys.stderr, f"hcd probe --device {device}", total=7, compiles=False) as bar:
            def step(what, i, n):
                bar.update(detail=what, completed=i, total=n)
            result = run_probe(device, threads=threads, timer=timer, quick=quick, progress=step)
            bar.update(detail="done", completed=7)
        for w in result.warnings:
            click.echo(f"warning: {w}", err=True)
        click.echo(f"spread: fp32 {_spread(result.figures['gemm_float32'], 1e-9)} GFLOP/s (every figure's is in "
                   "the file)", err=True)
        text = result.hcd_text(name)
        result.hcd(name)              # validated before it is printed or written
        if path is not None:
            write_atomically(path, text)
    except ProbeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except HCDError as exc:
        click.echo(f"error: the probe's HCD is invalid (a bug: please report it):\n{exc}", err=True)
        sys.exit(1)
    except OutputError as exc:   # the disk filled up while the probe ran: the old file is kept
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if output:
        click.echo(f"wrote {output}: {result.chip_name() if name is None else name} "
                   f"(fp32 {result.figures['gemm_float32'].value / 1e9:.1f} GFLOP/s, off-chip "
                   f"{result.figures['copy_bw'].value / 1e9:.1f} GB/s copy, launch "
                   f"{result.figures['launch'].value * 1e6:.2f} us)")
    else:
        click.echo(text, nl=False)


def _spread(fig, k: float) -> str:
    """``80.1-90.3 over 7 runs``: the range of the runs whose median is used."""
    return f"{min(fig.runs) * k:.1f}-{max(fig.runs) * k:.1f} over {len(fig.runs)} runs"
