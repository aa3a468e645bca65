"""Issue 53 point 11: installed from the wheel, ``torchfl examples --copy DIR`` exports every
bundled file the README (and the docs pages it links) names, under the README's paths, so
its commands resolve in DIR; ``torchfl examples`` lists them. The wheel is built and installed
with ``pip --target`` and run from an empty folder: the checkout is never what is imported."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.wheel_install import build_and_install

ROOT = Path(__file__).resolve().parents[2]
# (rules/*.py of ARCHITECTURE.md are modules of torchfl/rules/, not data)
NAMED = re.compile(r"(?<![\w/.-])((?:examples/[\w./-]*\w\.(?:hcd|py)|measurements/[\w./-]*\w\.csv"
                   r"|hcd_registry/[\w.-]*\.hcd|rules/[\w.-]*\.yaml))")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def named_files() -> set[str]:
    """Every bundled file the README and the docs pages name by its path."""
    return {m for page in _pages() for m in NAMED.findall(page.read_text(encoding="utf-8"))}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    return build_and_install(tmp_path_factory.mktemp("wheel53"))


def _torchfl(installed, args, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_")}
    env["PYTHONPATH"] = str(installed / "site")
    env["XDG_DATA_HOME"] = str(installed / "data")
    code = f"import sys; sys.argv = ['torchfl', *{args!r}]\nfrom torchfl.cli.main import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_readme_names_bundled_files():
    names = named_files()
    assert "examples/tiny_kv.hcd" in names and any(n.startswith("measurements/") for n in names), names
    missing = sorted(n for n in names if not (ROOT / n).is_file())
    assert not missing, f"the README/docs name files the checkout does not have: {missing}"


@pytest.mark.slow
def test_installed_wheel_exports_every_file_the_readme_names(installed, tmp_path):
    listing = _torchfl(installed, ["examples"], tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "_bundled" in listing.stdout and "examples/tiny_kv.hcd" in listing.stdout, listing.stdout
    dest = tmp_path / "ex"
    res = _torchfl(installed, ["examples", "--copy", str(dest)], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    missing = sorted(n for n in named_files() if not (dest / n).is_file())
    assert not missing, f"`torchfl examples --copy` left out files the README names: {missing}"
    validate = _torchfl(installed, ["hcd", "validate", "examples/tiny_kv.hcd"], dest)  # a README path, in DIR
    assert validate.returncode == 0, validate.stdout + validate.stderr
    # within 100 columns, but for the paths of this installation and of DIR (a path is not wrapped)
    lines = [x for x in (listing.stdout + res.stdout).splitlines() if str(installed) not in x and str(dest) not in x]
    assert lines and max(len(x) for x in lines) <= 100


def test_copy_refuses_to_overwrite_a_different_file(tmp_path):
    from click.testing import CliRunner

    from torchfl.cli.main import cli

    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "tiny_kv.hcd").write_text("mine\n")
    res = CliRunner().invoke(cli, ["examples", "--copy", str(tmp_path)])
    assert res.exit_code == 1 and "tiny_kv.hcd exists with other contents" in res.output, res.output
    assert (tmp_path / "examples" / "tiny_kv.hcd").read_text() == "mine\n"
    assert not (tmp_path / "hcd_registry").exists()          # nothing was copied
