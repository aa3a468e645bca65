"""Where the planner gets a chip's HCD and the rule packs.

``chip`` may be an :class:`torchfl.hcd.HCD` (tests, modified chips: rule packs then come
from ``registry`` if given, else the bundled packs) or a name. A name is looked up in
``registry`` (a :class:`torchfl.registry.Registry` or a URL); with ``registry=None``
the default registry (``TORCHFL_REGISTRY_URL`` or the user's, seeded on first use with
the bundled chips and packs) is used. Results are cached per (registry url, name).
"""

from __future__ import annotations

from functools import lru_cache

from torchfl.planner.errors import ChoiceError


def bundled_chips() -> dict:
    """name -> HCD for the chips shipped with torchfl (validated)."""
    return dict(_bundled_chips())


@lru_cache(maxsize=1)
def _bundled_chips():
    from torchfl.hcd import load_hcd
    from torchfl.resources import bundled_hcds

    out = {}
    for path in bundled_hcds():
        hcd = load_hcd(path)
        out[hcd.chip.name] = hcd
    return tuple(sorted(out.items()))


@lru_cache(maxsize=1)
def bundled_packs() -> tuple:
    """The bundled rule packs, parsed, in file-name order."""
    from torchfl.resources import bundled_rule_packs
    from torchfl.rules import load_pack

    return tuple(load_pack(p) for p in bundled_rule_packs())


def _registry(registry):
    from torchfl.registry import Registry

    if registry is None or isinstance(registry, str):
        return Registry(registry)
    return registry


@lru_cache(maxsize=32)
def _from_registry(url: str | None, name: str):
    from torchfl.registry import NotFound

    reg = _registry(url)
    try:
        hcd = reg.chip(name)
    except NotFound:
        names = sorted(s.name for s in reg.chips())
        raise ChoiceError(f"unknown chip {name!r} in registry {reg.display_url}; choose one of "
                          f"{', '.join(names) or '(none: run `torchfl registry import FILE.hcd`)'}") from None
    return hcd, _packs_of(reg)


def _packs_of(reg) -> tuple:
    packs = []
    for summary in sorted(reg.packs(), key=lambda s: s.name):
        packs.append(reg.pack(summary.name))
    return tuple(packs)


def resolve(chip, registry=None):
    """``(hcd, packs)`` for ``chip`` (an HCD or a name), see the module docstring."""
    from torchfl.hcd import HCD

    if isinstance(chip, HCD):
        if registry is None:
            return chip, bundled_packs()
        return chip, _packs_of(_registry(registry))
    if not isinstance(chip, str) or not chip:
        raise ChoiceError(f"chip must be a chip name or an HCD, got {chip!r}")
    if registry is not None and not isinstance(registry, str):
        return _from_registry_obj(registry, chip)
    return _from_registry(registry, chip)


def _from_registry_obj(reg, name):
    key = getattr(reg, "url", None)
    return _from_registry(key, name) if isinstance(key, str) else _from_registry.__wrapped__(reg, name)
