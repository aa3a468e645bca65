"""Fixtures shared by every layer's tests.

``registry_url`` is parametrised over both registry backends: an SQLite file in the
test's temporary directory, and a fresh database on a real PostgreSQL server that this
session starts (``tests/pg_server.py``). It gives an *empty, uninitialised* URL; call
``Registry(url).init()`` (``seed=True`` for the bundled chips). Tests that need the
server directly take ``pg_server``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# CI (CI=true) replays the same examples on every run, so a submission's result does not
# depend on luck; local runs keep exploring new examples (that is how the guard parser's
# span bug was found). A failure found locally becomes a fixed regression case.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

from tests.pg_server import PostgresUnavailable, start_server

# The tests never read or write the user's own default registry (XDG_DATA_HOME/torchfl): a
# registry another torchfl wrote (a newer HCD field, an experiment's chip) made tests that
# use the default fail on a developer's machine and pass in CI. Each test process (xdist
# worker) gets an empty data directory, inherited by the subprocesses it starts, removed at exit.
import atexit
import shutil
import tempfile

# pytest-xdist's workers start with COLUMNS=80 (a plain run has none): output that wraps at the
# terminal's width then differed between `pytest` and `pytest -n 2`. Tests see a pipe (100
# columns) unless they set COLUMNS themselves.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

_DATA_HOME = tempfile.mkdtemp(prefix="torchfl-test-data-")
os.environ["XDG_DATA_HOME"] = _DATA_HOME
atexit.register(shutil.rmtree, _DATA_HOME, ignore_errors=True)


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


# The npu eager device (tests/eager): which chip each index is is fixed at its first use in
# the process, so it is chosen here, before any test: npu:0 a chip with a float32 unit
# (results comparable with CPU float32), npu:1 another chip (float16, NHCW default layout),
# npu:2 a chip with 1 GiB of memory (out-of-memory tests).
os.environ.setdefault("TORCHFL_DEVICES", "TFL-X1,NPU-V3,EDGE-C2")


def pytest_collection_modifyitems(session, config, items):
    """Load (building once, cached in the user cache directory) the npu device's C++
    adapter before any test runs when eager tests are selected: the autograd engine sizes
    its per-device queues at the first backward of the process, so the device must exist
    before any test (of any layer) runs a backward."""
    if any("/tests/eager/" in str(item.fspath).replace(os.sep, "/") for item in items):
        from torchfl.runtime import eager

        eager.register()
        eager.ensure_adapter()
