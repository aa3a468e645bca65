"""Conformance tests: a real SQLite registry seeded with the bundled chips and rule packs in
a temporary directory, real torch graphs through the torchfl backend, real Numba kernels
(compiled into the one kernel cache every entry point uses: README, tests/cli/test_one_kernel_cache.py)."""
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
