"""The resolved chip target: one chip's HCD, the rule packs, its ChipModel and content hash.

Why one object: the planner prices a graph with a chip's numbers and the runtime executes
the plan with the same numbers. Resolving the chip twice (once per layer, by name) let a
plan made from a modified HCD run against whatever the registry held under that name.
Now the chip is resolved once, here, into a frozen :class:`Target`; the plan records the
target's ``chip_hash`` (and, in this process, the target itself), and the runtime takes
the target from the plan (or is given one) and checks the hash. Only this module opens the
registry for planning and execution.

``resolve_target(chip, registry=None)``: ``chip`` is a :class:`Target` (passes through),
an :class:`~torchfl.hcd.HCD` (tests, modified chips) or a chip name.

* a name is looked up in ``registry`` (a URL, a :class:`~torchfl.registry.Registry`, or
  None for ``TORCHFL_REGISTRY_URL`` / the user's default registry, seeded on first use),
  with that registry's rule packs;
* an HCD with ``registry=None`` gets the bundled rule packs and opens no registry; with a
  registry it gets that registry's packs, and if the registry holds the same chip name and
  version with other content, :class:`ChipMismatch` is raised (a published version is
  immutable: bump the version or rename the chip), never a silent run.

Targets are cached per (registry URL, chip name) and (registry URL, content hash), one
cache for the process; the registry's rule packs are read once per registry URL.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache

from torchfl.planner.errors import ChoiceError

__all__ = ["Target", "ChipMismatch", "resolve_target", "resolve_errors", "bundled_packs", "registry_key",
           "registered_chips"]


class ChipMismatch(ChoiceError):
    """The HCD given and the registry's chip of the same name and version differ."""


@dataclass(frozen=True, eq=False)
class Target:
    """One resolved chip: ``hcd`` (validated HCD), ``packs`` (parsed rule packs, in name
    order), ``model`` (the :class:`~torchfl.kernels.chip.ChipModel` the kernels and the
    cost model read). ``chip_hash`` is the HCD's content hash (sha256 of its canonical
    form): two targets with equal hashes are the same chip. Build with :meth:`of`."""

    hcd: object
    packs: tuple
    model: object

    @classmethod
    def of(cls, hcd, packs=None) -> "Target":
        """The target of ``hcd`` with ``packs`` (default: the bundled rule packs)."""
        from torchfl.kernels.chip import ChipModel

        packs = bundled_packs() if packs is None else tuple(packs)
        return cls(hcd, packs, ChipModel.from_hcd(hcd))

    @property
    def name(self) -> str:
        return self.hcd.chip.name

    @property
    def version(self) -> str:
        return str(self.hcd.chip.version)

    @property
    def chip_hash(self) -> str:
        return self.model.hcd_hash

    def __repr__(self) -> str:
        return f"Target({self.name} {self.version}, hash {self.chip_hash[:12]}, {len(self.packs)} packs)"


@lru_cache(maxsize=1)
def bundled_packs() -> tuple:
    """The bundled rule packs, parsed, in file-name order."""
    from torchfl.resources import bundled_rule_packs
    from torchfl.rules import load_pack

    return tuple(load_pack(p) for p in bundled_rule_packs())


def registry_key(registry) -> str:
    """The URL a registry argument (None, a URL, a Registry) resolves to, cheaply."""
    if registry is None or isinstance(registry, str):
        from torchfl.registry.url import resolve_url

        return resolve_url(registry)[0]
    return registry.url


_LOCK = threading.Lock()
_TARGETS: dict[tuple, Target] = {}
_PACKS: dict[str, tuple] = {}


def resolve_target(chip, registry=None, *, expect_hash: str | None = None, version: str | None = None) -> Target:
    """The :class:`Target` of ``chip`` (see the module docstring), cached.

    ``version``: that version of the chip name (default: the latest), with the registry's packs.

    ``expect_hash``: the content hash the caller read from the registry just now. A cached
    target of that name with another hash is from before the registry changed under this
    process: it is dropped and the chip resolved again (the result may still differ, if the
    registry changed once more)."""
    from torchfl.hcd import HCD

    if version is not None and not isinstance(chip, str):
        raise ChoiceError(f"a chip version ({version}) is looked up by chip name, not in a {type(chip).__name__}; "
                          "pass the chip's name")
    if isinstance(chip, Target):
        return chip
    if isinstance(chip, HCD):
        if registry is None:
            return _cached(("bundled", chip.content_hash()), lambda: Target.of(chip))
        key = registry_key(registry)
        return _cached((key, chip.content_hash()), lambda: _given_hcd(chip, registry, key))
    if not isinstance(chip, str) or not chip:
        raise ChoiceError(f"chip must be a chip name, an HCD or a Target, got {chip!r}")
    key = registry_key(registry)
    if version is not None:
        return _cached((key, "name", chip, str(version)), lambda: _from_registry(chip, registry, key, str(version)))
    if expect_hash is not None:
        with _LOCK:
            hit = _TARGETS.get((key, "name", chip))
            if hit is not None and hit.chip_hash != expect_hash:
                del _TARGETS[(key, "name", chip)]
                _PACKS.pop(key, None)
    return _cached((key, "name", chip), lambda: _from_registry(chip, registry, key))


def resolve_errors() -> tuple:
    """What :func:`resolve_target` raises for a chip it cannot resolve (an unknown name, a
    mismatch, a registry it cannot read): the caller's to report, each one line with its fix."""
    from torchfl.planner.errors import PlanError
    from torchfl.registry import RegistryError

    return PlanError, RegistryError


def registered_chips(registry=None) -> list:
    """The names of the chips ``registry`` holds (None: the default registry), sorted."""
    from torchfl.registry import open_registry

    return sorted(s.name for s in open_registry(registry).chips())


def clear_cache() -> None:
    """Forget resolved targets and packs (a registry changed under this process)."""
    with _LOCK:
        _TARGETS.clear()
        _PACKS.clear()


def _cached(key, build) -> Target:
    with _LOCK:
        hit = _TARGETS.get(key)
    if hit is None:
        hit = build()
        with _LOCK:
            hit = _TARGETS.setdefault(key, hit)
    return hit


def _packs_of(reg, key: str) -> tuple:
    with _LOCK:
        hit = _PACKS.get(key)
    if hit is None:
        hit = tuple(reg.pack(s.name) for s in sorted(reg.packs(), key=lambda s: s.name))
        with _LOCK:
            hit = _PACKS.setdefault(key, hit)
    return hit


def _from_registry(name: str, registry, key: str, version: str | None = None) -> Target:
    from torchfl.registry import NotFound, open_registry

    reg = open_registry(registry)
    try:
        hcd = reg.chip(name, version)
    except NotFound:
        names = sorted(s.name for s in reg.chips())
        if name in names:
            raise   # the name is there, not that version: the registry's own sentence says so
        raise ChoiceError(f"unknown chip {name!r} in registry {reg.display_url}; choose one of "
                          f"{', '.join(names) or '(none: run `torchfl registry import FILE.hcd`)'}") from None
    return Target.of(hcd, _packs_of(reg, key))


def _given_hcd(hcd, registry, key: str) -> Target:
    from torchfl.registry import NotFound, open_registry

    reg = open_registry(registry)
    try:
        held = reg.record(hcd.chip.name, str(hcd.chip.version))
    except NotFound:
        held = None
    if held is not None and held.content_hash != hcd.content_hash():
        raise ChipMismatch(
            f"chip {hcd.chip.name} {hcd.chip.version}: the HCD given differs from the one registry "
            f"{reg.display_url} holds under that name and version (content hash "
            f"{hcd.content_hash()[:12]} vs {held.content_hash[:12]}); a published version is immutable: "
            "bump chip.version (or rename the chip) in the modified HCD, or plan with the registry's chip "
            "by name")
    return Target.of(hcd, _packs_of(reg, key))
