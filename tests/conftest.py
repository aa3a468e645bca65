"""Fixtures shared by every layer's tests.

``registry_url`` is parametrised over both registry backends: an SQLite file in the
test's temporary directory, and a fresh database on a real PostgreSQL server that this
session starts (``tests/pg_server.py``). It gives an *empty, uninitialised* URL; call
``Registry(url).init()`` (``seed=True`` for the bundled chips). Tests that need the
server directly take ``pg_server``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# CI (CI=true) replays the same examples on every run, so a submission's result does not
# depend on luck; local runs keep exploring new examples (that is how the guard parser's
# span bug was found). A failure found locally becomes a fixed regression case.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pg_server import PostgresUnavailable, start_server  # noqa: E402


@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL server per test process (xdist worker), stopped at the end."""
    try:
        server = start_server()
    except PostgresUnavailable as exc:
        pytest.fail(f"PostgreSQL is required by the registry tests: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server):
    """A fresh, empty database on the session's server."""
    name = pg_server.create_database()
    yield pg_server.url(name)
    pg_server.drop_database(name)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def registry_url(request, tmp_path):
    """An empty registry URL, once per backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.sqlite3'}"
    else:
        yield request.getfixturevalue("pg_url")
