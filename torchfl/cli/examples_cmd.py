"""``torchfl examples [--copy DIR]``: the files the README names (``examples/...``,
``hcd_registry/...``, ``rules/...``, ``measurements/...``), listed or exported.

Why: in a checkout those paths resolve from its top; installed from the wheel they live under
``torchfl/_bundled/`` (pyproject's force-include), where a user would not look. ``--copy DIR``
writes them under DIR with the README's relative paths, so ``cd DIR`` makes every README
command that names one work as printed. Reads files only (no torch, no registry).
"""

from __future__ import annotations

import filecmp
import shutil
import sys
from pathlib import Path

import click

#: the bundled folders, in the order the README introduces them, and what each holds
FOLDERS = (
    ("examples", "example chips and a model file the README's commands use"),
    ("hcd_registry", "the reference chips (HCD files) the default registry is seeded with"),
    ("rules", "the rule packs (which kernel runs which ATen op)"),
    ("measurements", "published op and serving measurements `torchfl fidelity` scores"),
)


def bundled_files() -> list[tuple[str, Path]]:
    """(path as the README names it, where it is in this installation), every bundled file."""
    from torchfl.resources import bundled_path

    out = []
    for folder, _what in FOLDERS:
        root = bundled_path(folder)
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not _ignored(p)):
            out.append((f"{folder}/{path.relative_to(root).as_posix()}", path))
    return out


def _ignored(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo") or path.name.startswith(".")


@click.command("examples")
@click.option("--copy", "dest", metavar="DIR", default=None,
              help="Copy every listed file under DIR, keeping the README's paths (examples/..., measurements/...).")
def examples(dest):
    """List the bundled example chips, rule packs, measurements and example models, with where
    this installation keeps them; --copy DIR exports them so the README's paths resolve in DIR."""
    files = bundled_files()
    if dest is None:
        _list(files)
        return
    _copy(files, Path(dest).expanduser())


def _list(files) -> None:
    from torchfl.resources import bundled_path

    for folder, what in FOLDERS:
        names = [n for n, _p in files if n.split("/", 1)[0] == folder]
        click.echo(f"{folder}/ ({len(names)} files): {what}")
        click.echo(f"  in {bundled_path(folder)}")
        for n in names:
            click.echo(f"  {n}")
    click.echo("copy them where the README's paths resolve: torchfl examples --copy DIR, then cd DIR")


def _copy(files, dest: Path) -> None:
    if dest.exists() and not dest.is_dir():
        _fail(f"--copy {dest}: not a folder; give a folder (it is created if missing)")
    clash = [n for n, src in files if (dest / n).exists() and not ((dest / n).is_file() and filecmp.cmp(src, dest / n,
                                                                                                        shallow=False))]
    if clash:
        more = f" and {len(clash) - 1} more files exist" if len(clash) > 1 else " exists"
        _fail(f"--copy {dest}: {dest / clash[0]}{more} with other contents; nothing was copied "
              "(choose an empty folder, or move those files away)")
    copied = same = 0
    try:
        for name, src in files:
            target = dest / name
            if target.exists():
                same += 1
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)
            copied += 1
    except OSError as exc:
        _fail(f"--copy {dest}: {exc.strerror or exc} ({exc.filename or dest}); choose a writable folder")
    kept = f", {same} already there" if same else ""
    click.echo(f"copied {copied} files to {dest}{kept}: " + ", ".join(f"{f}/" for f, _w in FOLDERS))
    click.echo(f"the README's paths resolve there: cd {dest}")


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)
