"""The built wheel carries its run-time data: installed outside the checkout, it validates
its bundled chips and finds its migrations and rule packs.

The wheel is installed with ``pip --target`` into a temporary folder (no dependencies:
they are the ones this venv already has) and run from another folder, with that target
first on ``sys.path``, so the checkout is never what gets imported.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.wheel_install import build_and_install



@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    return build_and_install(tmp_path_factory.mktemp("wheel"))


def run_installed(installed, code: str):
    env = {**os.environ, "PYTHONPATH": str(installed / "site")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=str(installed), env=env)


def test_wheel_bundles_data_and_validates_chips(installed):
    code = (
        "import torchfl, torchfl.resources as r, sys\n"
        "assert torchfl.__file__.startswith(%r), torchfl.__file__\n"
        "names = [p.name for p in r.bundled_hcds()]\n"
        "assert 'npu_v3.hcd' in names and len(names) >= 6, names\n"
        "assert all('_bundled' in str(p) for p in r.bundled_hcds())\n"
        "for n in ('migrations', 'alembic.ini', 'rules'):\n"
        "    assert '_bundled' in str(r.bundled_path(n)), n\n"
        "from torchfl.cli.main import cli\n"
        "sys.argv = ['torchfl', 'hcd', 'validate', '-q', *map(str, r.bundled_hcds())]\n"
        "cli(prog_name='torchfl')\n"
    ) % str(installed / "site")
    result = run_installed(installed, code)
    assert result.returncode == 0, result.stdout + result.stderr
