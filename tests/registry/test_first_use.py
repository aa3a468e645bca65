"""Right after install: the default registry is created, migrated and seeded on first use.

An explicit URL is never created behind the user's back: it says to run ``init``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchfl.registry.names import HEAD
from torchfl.resources import bundled_hcds

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, url: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TORCHFL_REGISTRY_URL"}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")  # platformdirs' user data dir on Linux
    if url:
        env["TORCHFL_REGISTRY_URL"] = url
    return env


def _cli(env, *args):
    return subprocess.Popen([sys.executable, "-m", "torchfl.cli", "registry", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_first_use(registry_url, tmp_path):
    expected = {p.stem.upper().replace("_", "-") for p in bundled_hcds()}
    if registry_url.startswith("sqlite"):
        env = _env(tmp_path, None)
        # two first uses at once: one creates and seeds under the lock, the other waits
        procs = [_cli(env, "list", "--json"), _cli(env, "list", "--json")]
        outs = [p.communicate(timeout=120) for p in procs]
        for (out, err), p in zip(outs, procs):
            assert p.returncode == 0, err
            data = json.loads(out)
            assert {c["name"] for c in data["chips"]} == expected
            assert data["url"] == f"sqlite:///{tmp_path}/data/torchfl/registry.sqlite3"
        assert (tmp_path / "data/torchfl/registry.sqlite3").exists()
        # a data directory that cannot be created: one line, exit 2
        (tmp_path / "afile").write_text("")
        env["XDG_DATA_HOME"] = str(tmp_path / "afile" / "data")
        p = _cli(env, "list")
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2 and err.count("\n") == 1 and "Not a directory" in err and "--registry" in err
    else:
        env = _env(tmp_path, registry_url)
        out, err = _cli(env, "list").communicate(timeout=120)
        assert "not a torchfl registry" in err and "torchfl registry init" in err
        p = _cli(env, "init")
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and f"created schema {HEAD}" in out and "bundled: " in out, err
        out, err = _cli(env, "list", "--json").communicate(timeout=120)
        assert {c["name"] for c in json.loads(out)["chips"]} == expected


def test_default_registry_takes_in_newly_bundled_packs(registry_url, tmp_path):
    """A default registry made by an older torchfl (here: without any rule pack, no stamp)
    gets the bundled packs on its next use; what it held stays; later uses change nothing."""
    if not registry_url.startswith("sqlite"):
        pytest.skip("the default registry is always an SQLite file")
    from torchfl.registry import Registry
    from torchfl.resources import bundled_rule_packs
    from torchfl.rules import load_pack

    path = tmp_path / "data/torchfl/registry.sqlite3"
    old = Registry(f"sqlite:///{path}")
    old.init()
    old.import_files([str(p) for p in bundled_hcds()])
    assert not old.packs()
    env = _env(tmp_path, None)
    out, err = _cli(env, "list", "--json").communicate(timeout=120)
    data = json.loads(out)
    expected = {(p.name, p.version) for p in map(load_pack, bundled_rule_packs())}
    assert {(p["name"], p["latest"]) for p in data["packs"]} == expected, err
    assert {c["name"] for c in data["chips"]} == {p.stem.upper().replace("_", "-") for p in bundled_hcds()}
    stamp = path.with_name(path.name + ".bundled")
    assert stamp.exists()
    before = path.stat().st_mtime_ns, stamp.read_text()
    out, err = _cli(env, "list", "--json").communicate(timeout=120)
    assert json.loads(out) == data and (path.stat().st_mtime_ns, stamp.read_text()) == before


def test_queries_import_neither_torch_nor_numba(registry_url, tmp_path):
    """The cold-start rule: registry queries never load torch or numba, nor SQLAlchemy (drivers only)."""
    from torchfl.registry import Registry

    with Registry(registry_url) as r:
        r.init(seed=True)
    code = (
        "import sys\nfrom torchfl.cli.main import cli\n"
        "for args in (['list'], ['list', '--json'], ['show', 'NPU-V3'], ['history', 'NPU-V3', '--json'],"
        " ['diff', 'NPU-V3', '1.0.0', '1.0.0']):\n"
        f"    try:\n        cli(['registry', '--registry', {registry_url!r}, *args], prog_name='torchfl')\n"
        "    except SystemExit as e:\n        assert e.code in (0, None), (args, e.code)\n"
        "print('LOADED', ' '.join(m for m in ('torch', 'numba', 'sqlalchemy', 'alembic', 'pydantic')"
        " if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    loaded = proc.stdout.rsplit("LOADED", 1)[1].split()
    assert not {"torch", "numba", "alembic", "sqlalchemy"} & set(loaded), loaded
