"""Shared fixtures: bundled chips and packs (no registry needed). Plain helpers live in
planner_helpers.py: a module named ``conftest`` is ambiguous once several test folders are
collected together."""

import warnings

import pytest

warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="session")
def chips():
    from torchfl.planner.source import bundled_chips

    return bundled_chips()


@pytest.fixture(scope="session")
def packs():
    from torchfl.planner.source import bundled_packs

    return bundled_packs()


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning")
