"""An installed wheel, outside the checkout, creates, seeds and upgrades a registry on both backends
from the migrations and chips it carries under ``torchfl/_bundled/``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchfl.registry.names import HEAD

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out / "dist"), str(ROOT)], check=True)
    wheel = next((out / "dist").glob("torchfl-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(out / "site"),
                    str(wheel)], check=True)
    return out / "site"


def test_installed_wheel_inits_and_upgrades_a_registry(site, registry_url, tmp_path):
    code = (
        "import sys, torchfl, torchfl.registry.migrate as m\n"
        f"assert torchfl.__file__.startswith({str(site)!r}), torchfl.__file__\n"
        "assert '_bundled' in str(m.alembic_config().get_main_option('script_location'))\n"
        "from torchfl.registry import Registry\n"
        f"r = Registry({registry_url!r})\n"
        "print(r.init(seed=True)['seeded']['added'])\n"
        "print(r.upgrade())\n"
        "print(r.chip('NPU-V3').chip.version)\n"
        "print(','.join(s.name for s in r.systems()))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    added, before, version, systems = proc.stdout.split()
    assert int(added) >= 6 and before == HEAD and version == "1.0.0"
    assert "HGX-H100-8" in systems.split(",")      # hcd_registry/systems/ travels in the wheel
