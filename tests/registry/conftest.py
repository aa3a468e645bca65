"""Registry test fixtures: an initialised registry per backend, and the CLI runner."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from torchfl.registry import Registry


@pytest.fixture
def reg(registry_url):
    """An initialised, empty registry (schema at head), once per backend."""
    r = Registry(registry_url)
    r.init()
    yield r
    r.close()


@pytest.fixture
def cli(registry_url):
    """``cli("list", "--json")`` runs ``torchfl registry --registry URL list --json`` in-process."""
    from torchfl.cli.main import cli as root

    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(root, ["registry", "--registry", registry_url, *args], catch_exceptions=False)

    return run
