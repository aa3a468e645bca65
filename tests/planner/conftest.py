"""Shared fixtures: bundled chips and packs (no registry needed). Plain helpers live in
planner_helpers.py: a module named ``conftest`` is ambiguous once several test folders are
collected together."""

import warnings

import pytest

warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="session")
def chips():
    """name -> HCD of the chips shipped with torchfl (validated)."""
    from torchfl.hcd import load_hcd
    from torchfl.resources import bundled_hcds

    return {hcd.chip.name: hcd for hcd in map(load_hcd, bundled_hcds())}


@pytest.fixture(scope="session")
def packs():
    from torchfl.planner.target import bundled_packs

    return bundled_packs()


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning")
