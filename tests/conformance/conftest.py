"""Conformance tests: a real SQLite registry seeded with the bundled chips and rule packs in
a temporary directory, real torch graphs through the torchfl backend, real Numba kernels."""
import os

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "numba"))

import pytest


@pytest.fixture(scope="session")
def seeded_url(tmp_path_factory):
    from torchfl.registry import Registry

    url = f"sqlite:///{tmp_path_factory.mktemp('conformance-registry') / 'registry.db'}"
    Registry(url).init(seed=True)
    return url


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    import logging

    monkeypatch.delenv("TORCHFL_STRICT", raising=False)
    logging.getLogger("torchfl").setLevel(logging.ERROR)
    yield
