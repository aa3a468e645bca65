"""``torchfl registry``: a thin face over :class:`torchfl.registry.Registry`.

Every query takes ``--json``. Errors are one line on stderr, never a traceback: exit 1
when the content is refused (invalid file, immutable version, unknown chip), 2 when the
registry cannot be used (unreachable, not a registry, read-only, schema mismatch).
Heavy imports (SQLAlchemy, the HCD model, Alembic, rich's progress bar) happen inside the
commands that need them; SQLite queries need none of them (see torchfl/registry/reader.py).

Other command modules attach to this group (``support_cmd``: ops, support, why-not) and
should use :func:`registry_option`, :func:`open_registry` and :func:`handles_errors`.
"""

from __future__ import annotations

import functools
import json
import sys

import click

_META_KEY = "torchfl.registry_url"


def registry_option(f):
    """``--registry URL`` on a subcommand (it overrides the group's)."""
    return click.option("--registry", "registry_url", metavar="URL", default=None,
                        help="Registry database URL (sqlite:///PATH or postgresql://...); default: "
                             "$TORCHFL_REGISTRY_URL, else an SQLite file in the user data directory.")(f)


def json_option(f):
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(f)


def open_registry(url: str | None = None):
    """The Registry for this command: its ``--registry``, the group's, the environment, or the default."""
    from torchfl.registry import Registry

    ctx = click.get_current_context(silent=True)
    if not url and ctx is not None:
        url = ctx.meta.get(_META_KEY)
    return Registry(url)


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def handles_errors(f):
    """Turn RegistryError and bad input into one line on stderr and the right exit code."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        from torchfl.registry.errors import ImportRefused, RegistryError

        try:
            return f(*args, **kwargs)
        except ImportRefused:
            raise
        except RegistryError as exc:
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)

    return wrapper


def _emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _print_table(title: str, headers: tuple[str, ...], rows: list[tuple]) -> None:
    """Aligned plain-text columns, psql style.

    Not rich's Table: rendering 1,000 rows with it takes seconds on the project's
    machines, and plain columns pipe into grep/awk unchanged.
    """
    from torchfl.planner.texttable import paragraph, table

    cells = [tuple(str(c) for c in row) for row in rows]
    # fits the terminal (100 columns in a pipe); a registry URL longer than a line stands alone
    out = paragraph(title) + table(headers, cells)
    out.append(f"({len(cells)} row{'s' if len(cells) != 1 else ''})")
    click.echo("\n".join(out))


def _when(dt) -> str:
    return dt.strftime("%Y-%m-%d %H:%M:%SZ")


@click.group("registry")
@click.option("--registry", "registry_url", metavar="URL", default=None,
              help="Registry database URL (sqlite:///PATH or postgresql://USER@HOST:PORT/DB); default: "
                   "$TORCHFL_REGISTRY_URL, else an SQLite file in the user data directory.")
@click.pass_context
def registry(ctx: click.Context, registry_url: str | None) -> None:
    """The versioned registry of chips (HCDs) and rule packs."""
    if registry_url:
        ctx.meta[_META_KEY] = registry_url


@registry.command("init")
@registry_option
@click.option("--no-seed", is_flag=True, help="Do not import the chips and rule packs bundled with torchfl.")
@json_option
@handles_errors
def init_cmd(registry_url, no_seed, as_json):
    """Create the registry (or bring it to the current schema) and import the bundled chips."""
    reg = open_registry(registry_url)
    result = reg.init(seed=not no_seed)
    if as_json:
        return _emit_json(result)
    was = result["from"]
    state = "created" if was is None else ("already at" if was == result["to"] else f"upgraded from {was} to")
    click.echo(f"{reg.display_url}: {state} schema {result['to']}")
    if result["seeded"]:
        s = result["seeded"]
        click.echo(f"bundled: {s['added']} added, {s['unchanged']} unchanged")


@registry.command("upgrade")
@registry_option
@json_option
@handles_errors
def upgrade_cmd(registry_url, as_json):
    """Migrate an existing registry to this torchfl's schema (Alembic)."""
    from torchfl.registry.names import HEAD

    reg = open_registry(registry_url)
    before = reg.upgrade()
    if as_json:
        return _emit_json({"url": reg.display_url, "from": before, "to": HEAD})
    if before == HEAD:
        click.echo(f"{reg.display_url}: already at schema {HEAD}")
    else:
        click.echo(f"{reg.display_url}: upgraded schema {before} -> {HEAD}")


def _progress_printer(total_files: int):
    """A rich progress bar on stderr for long imports; None when it would only be noise."""
    if total_files < 50 or not sys.stderr.isatty():
        return None, None
    from rich.console import Console
    from rich.progress import Progress

    bar = Progress(console=Console(stderr=True), transient=True)
    tasks: dict = {}

    def report(stage, done, total):
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
        bar.update(tasks[stage], completed=done)

    return bar, report


@registry.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@registry_option
@json_option
@handles_errors
def import_cmd(files, registry_url, as_json):
    """Import HCDs (*.hcd) and rule packs (*.yaml with `pack:`): all of them or none.

    A directory stands for the *.hcd, *.yaml and *.yml files in it.

    A published (name, version) is immutable: identical content is `unchanged`, different
    content is refused (bump the version). Exit 1 if anything is invalid or refused.
    """
    from torchfl.registry.errors import ImportRefused

    from torchfl.registry.documents import expand_paths

    reg = open_registry(registry_url)
    files = expand_paths(files)
    bar, report = _progress_printer(len(files))
    try:
        if bar is not None:
            with bar:
                result = reg.import_files(files, progress=report)
        else:
            result = reg.import_files(files)
    except ImportRefused as exc:
        if as_json:
            _emit_json({"ok": False, "url": reg.display_url, "error": str(exc),
                        "diagnostics": [d.as_dict() for d in exc.diagnostics],
                        "conflicts": [c.as_dict() for c in exc.conflicts]})
        else:
            for d in exc.diagnostics:
                click.echo(str(d), err=True)
            for c in exc.conflicts:
                click.echo(f"error: {c}", err=True)
            click.echo(f"error: {exc} (registry {reg.display_url} left as it was)", err=True)
        sys.exit(exc.exit_code)
    if as_json:
        return _emit_json({"ok": True, "url": reg.display_url, **result.as_dict()})
    for w in result.warnings:
        click.echo(str(w), err=True)
    for o in result.outcomes:
        click.echo(f"{o.status:9} {o.kind} {o.name} {o.version}  sha256:{o.content_hash[:12]}  ({o.file})")
    click.echo(f"{len(result.added)} added, {len(result.unchanged)} unchanged in {reg.display_url}")


@registry.command("list")
@registry_option
@json_option
@handles_errors
def list_cmd(registry_url, as_json):
    """Chips (and rule packs) with their latest version."""
    reg = open_registry(registry_url)
    chips, packs = reg.chips(), reg.packs()
    if as_json:
        return _emit_json({"url": reg.display_url, "chips": [c.as_dict() for c in chips],
                           "packs": [p.as_dict() for p in packs]})
    _print_table(f"chips in {reg.display_url}", ("chip", "latest", "versions", "device type", "vendor", "imported"),
                 [(c.name, c.latest, len(c.versions), c.device_type, c.vendor, _when(c.imported_at)) for c in chips])
    if packs:
        click.echo()
        _print_table("rule packs", ("pack", "latest", "versions", "imported"),
                     [(p.name, p.latest, len(p.versions), _when(p.imported_at)) for p in packs])


def _kind(pack: bool) -> str:
    return "pack" if pack else "chip"


@registry.command("show")
@click.argument("name")
@click.option("--version", "version", default=None, metavar="V", help="A published version (default: latest).")
@click.option("--pack", is_flag=True, help="NAME is a rule pack, not a chip.")
@click.option("--source", is_flag=True, help="Print the file as imported instead of the canonical form.")
@registry_option
@json_option
@handles_errors
def show_cmd(name, version, pack, source, registry_url, as_json):
    """A chip's canonical HCD (or a rule pack), with its hash and import time."""
    reg = open_registry(registry_url)
    rec = reg.record(name, version, kind=_kind(pack))
    if as_json:
        data = {"url": reg.display_url, **rec.as_dict()}
        if source:
            data["source_text"] = rec.source_text
        return _emit_json(data)
    click.echo(f"# {rec.kind} {rec.name} {rec.version}")
    click.echo(f"# sha256:{rec.content_hash}")
    click.echo(f"# imported {_when(rec.imported_at)} (import #{rec.import_id}) from {rec.source_name}")
    if source:
        click.echo(rec.source_text, nl=not rec.source_text.endswith("\n"))
    else:
        import yaml

        click.echo(yaml.safe_dump(rec.canonical, sort_keys=False, allow_unicode=True), nl=False)


@registry.command("history")
@click.argument("name")
@click.option("--pack", is_flag=True, help="NAME is a rule pack, not a chip.")
@registry_option
@json_option
@handles_errors
def history_cmd(name, pack, registry_url, as_json):
    """Every published version of a chip, oldest first (semver order), with import times."""
    print_history(name, _kind(pack), registry_url, as_json)


def print_history(name: str, kind: str, registry_url, as_json: bool) -> None:
    """``registry history`` and ``system history``: the versions of a chip, pack or system."""
    reg = open_registry(registry_url)
    infos = reg.history(name, kind=kind)
    if as_json:
        return _emit_json({"url": reg.display_url, "name": name, "kind": kind,
                           "versions": [i.as_dict() for i in infos]})
    _print_table(f"{kind} {name} in {reg.display_url}", ("version", "sha256", "imported", "import", "from"),
                 [(i.version, i.content_hash[:16], _when(i.imported_at), f"#{i.import_id}", i.source_name)
                  for i in infos])


@registry.command("diff")
@click.argument("name")
@click.argument("v1")
@click.argument("v2")
@click.option("--pack", is_flag=True, help="NAME is a rule pack, not a chip.")
@registry_option
@json_option
@handles_errors
def diff_cmd(name, v1, v2, pack, registry_url, as_json):
    """Field-level changes between two versions (dotted paths; + added, - removed)."""
    reg = open_registry(registry_url)
    changes = reg.diff(name, v1, v2, kind=_kind(pack))
    if as_json:
        return _emit_json({"url": reg.display_url, "name": name, "kind": _kind(pack), "from": v1, "to": v2,
                           "changes": [c.as_dict() for c in changes]})
    click.echo(f"{_kind(pack)} {name} {v1} -> {v2}: {len(changes)} change(s)")
    for c in changes:
        click.echo(str(c))
