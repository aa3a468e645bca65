"""Shared fixtures: bundled chips and packs (no registry needed), captures cached per session."""

import os
import warnings

import pytest

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "numba"))
warnings.filterwarnings("ignore", category=FutureWarning)

_CAPTURES = {}


@pytest.fixture(scope="session")
def chips():
    from torchfl.planner.source import bundled_chips

    return bundled_chips()


@pytest.fixture(scope="session")
def packs():
    from torchfl.planner.source import bundled_packs

    return bundled_packs()


def captured(name, **options):
    """(captured graph, example inputs) of a zoo model, captured once per session."""
    key = (name, tuple(sorted(options.items())))
    if key not in _CAPTURES:
        from torchfl.planner.capture import capture_module
        from torchfl.planner.zoo import load_model

        module, inputs = load_model(name, **options)
        _CAPTURES[key] = (capture_module(module, inputs), inputs)
    return _CAPTURES[key]


def capture_of(module, inputs, key):
    if key not in _CAPTURES:
        from torchfl.planner.capture import capture_module

        _CAPTURES[key] = (capture_module(module, inputs), inputs)
    return _CAPTURES[key]


def hcd_variant(hcd, edit):
    """An HCD with its canonical data edited by ``edit(dict)`` (validated again)."""
    import json

    from torchfl.hcd import load_hcd_text

    data = json.loads(hcd.canonical_json())
    edit(data)
    return load_hcd_text(json.dumps(data), f"{hcd.chip.name}-variant.hcd")


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning")
