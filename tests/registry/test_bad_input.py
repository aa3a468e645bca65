"""Bad registries: unreachable, not a registry, read-only, wrong schema. One line, exit 2, no traceback."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tests.registry.registry_gen import hcd_text, write_hcds

from torchfl.registry import Registry, RegistryUnavailable, SchemaMismatch
from torchfl.registry.names import HEAD

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, env=None) -> subprocess.CompletedProcess:
    """The real command in a fresh process: what a user sees, traceback or not."""
    return subprocess.run([sys.executable, "-m", "torchfl.cli", "registry", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=120)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unreachable(registry_url: str, tmp_path: Path) -> str:
    if registry_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path}/no/such/dir/registry.sqlite3"
    return f"postgresql://postgres:hunter2@127.0.0.1:{_closed_port()}/torchfl"


def test_unreachable_url(registry_url, tmp_path):
    url = _unreachable(registry_url, tmp_path)
    shown = url.replace(":hunter2@", ":***@")
    for args in (["list"], ["show", "NPU-V3", "--json"], ["import", str(ROOT / "hcd_registry/npu_v3.hcd")]):
        proc = run_cli("--registry", url, *args)
        line = one_line_error(proc, shown)
        assert "hunter2" not in line
        assert "torchfl registry init" in line or "check that the server is running" in line


def test_url_in_environment_and_bad_url_syntax(registry_url, tmp_path):
    url = _unreachable(registry_url, tmp_path)
    one_line_error(run_cli("list", env={"TORCHFL_REGISTRY_URL": url}), url.replace(":hunter2@", ":***@"))
    one_line_error(run_cli("--registry", "not a url", "list"), "not a database URL", "sqlite:///PATH")
    one_line_error(run_cli("--registry", "mysql://u@h/db", "list"), "not supported")
    one_line_error(run_cli("--registry", "sqlite://", "list"), "in-memory", "sqlite:///PATH")


def test_not_a_registry(registry_url, tmp_path):
    if registry_url.startswith("sqlite"):
        junk = tmp_path / "junk.sqlite3"
        junk.write_text("this is a text file, not a database\n" * 50)
        one_line_error(run_cli("--registry", f"sqlite:///{junk}", "list"), str(junk), "not a torchfl registry")
    # a real database of the backend, but with somebody else's tables
    from sqlalchemy import create_engine, text

    engine = create_engine(registry_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE payroll (id INTEGER PRIMARY KEY)"))
    engine.dispose()
    line = one_line_error(run_cli("--registry", registry_url, "list"), "not a torchfl registry")
    assert "torchfl registry init" in line
    with pytest.raises(RegistryUnavailable):
        Registry(registry_url).chips()


@contextlib.contextmanager
def read_only(paths):
    """Make files/folders unwritable even for root (chattr +i), or by mode when not root."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("running as root without chattr (e2fsprogs): cannot make a file read-only for root")
        proc = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"running as root on a filesystem without chattr +i ({proc.stderr.strip()}): "
                        "cannot make a file read-only for root here")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", *map(str, paths)], check=True)
    else:
        modes = {p: os.stat(p).st_mode for p in paths}
        for p in paths:
            os.chmod(p, 0o555 if os.path.isdir(p) else 0o444)
        try:
            yield
        finally:
            for p, m in modes.items():
                os.chmod(p, m)


def test_read_only_registry(registry_url, tmp_path):
    (chip,) = write_hcds(tmp_path, [("a.hcd", hcd_text("A-1"))])
    (other,) = write_hcds(tmp_path, [("b.hcd", hcd_text("B-1"))])
    if registry_url.startswith("sqlite"):
        folder = Path(tempfile.mkdtemp(prefix="torchfl-ro-"))
        url = f"sqlite:///{folder}/registry.sqlite3"
        with Registry(url) as r:
            r.init()
            r.import_files([chip])
        with read_only([folder / "registry.sqlite3", folder]):
            ok = run_cli("--registry", url, "list", "--json")
            assert ok.returncode == 0 and "A-1" in ok.stdout, ok.stderr
            one_line_error(run_cli("--registry", url, "import", other), url, "read-only", "writable")
        assert [c.name for c in Registry(url).chips()] == ["A-1"]
    else:
        with Registry(registry_url) as r:
            r.init()
            r.import_files([chip])
        from sqlalchemy import create_engine, text

        engine = create_engine(registry_url)
        database = registry_url.rsplit("/", 1)[1]
        with engine.begin() as conn:
            conn.execute(text("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'reader') "
                              "THEN CREATE ROLE reader LOGIN; END IF; END $$"))
            conn.execute(text(f'GRANT CONNECT ON DATABASE "{database}" TO reader'))
            conn.execute(text("GRANT USAGE ON SCHEMA public TO reader"))
            conn.execute(text("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader"))
        engine.dispose()
        url = registry_url.replace("//postgres@", "//reader@")
        ok = run_cli("--registry", url, "list", "--json")
        assert ok.returncode == 0 and "A-1" in ok.stdout, ok.stderr
        one_line_error(run_cli("--registry", url, "import", other), "reader@", "read-only")


def test_schema_older_than_code_says_upgrade(registry_url, tmp_path):
    from torchfl.registry import migrate
    from torchfl.registry.engine import create_registry_engine

    with Registry(registry_url) as r:
        r.init()
    engine = create_registry_engine(registry_url)
    with engine.begin() as conn:
        migrate.downgrade(conn, "0001")
    engine.dispose()
    with pytest.raises(SchemaMismatch, match="torchfl registry upgrade"):
        Registry(registry_url).chips()
    one_line_error(run_cli("--registry", registry_url, "list"), "older", "torchfl registry upgrade")
    up = run_cli("--registry", registry_url, "upgrade")
    assert up.returncode == 0 and f"0001 -> {HEAD}" in up.stdout, up.stderr
    assert Registry(registry_url).chips() == []


def test_schema_newer_than_code_refuses_writes(registry_url, tmp_path):
    (chip,) = write_hcds(tmp_path, [("a.hcd", hcd_text("A-1"))])
    with Registry(registry_url) as r:
        r.init()
        r.import_files([chip])
    from sqlalchemy import text

    from torchfl.registry.engine import create_registry_engine

    engine = create_registry_engine(registry_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    engine.dispose()
    r = Registry(registry_url)
    assert [c.name for c in r.chips()] == ["A-1"]  # reads still work
    (other,) = write_hcds(tmp_path, [("b.hcd", hcd_text("B-1"))])
    with pytest.raises(SchemaMismatch, match="refusing to write"):
        r.import_files([other])
    one_line_error(run_cli("--registry", registry_url, "import", other), "newer", "upgrade torchfl")
    one_line_error(run_cli("--registry", registry_url, "upgrade"), "newer")
