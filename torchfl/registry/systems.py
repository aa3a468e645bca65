"""System descriptors in the registry: each one's chip checked against what the registry holds.

A system names a chip by name (and optionally version). The registry accepts it only when that
chip is published there, or arrives in the same import; :func:`check_system_documents` says so
located at the file's ``chips.name`` before anything is written (the store checks again inside
the transaction). :func:`load_system_spec` turns what a user types after ``--system`` (a file or
a published name) into a checked :class:`~torchfl.hcd.system.System`.
"""

from __future__ import annotations

from pathlib import Path


def _with_batch(catalog: dict, docs) -> dict:
    """The registry's catalog plus the chips of this import (their HCDs are in ``canonical_json``)."""
    import json

    from torchfl.registry.semver import semver_key

    out = {name: dict(versions) for name, versions in catalog.items()}
    for d in docs:
        if d.kind == "chip":
            out.setdefault(d.name, {})[d.version] = "interconnect" in json.loads(d.canonical_json)
    return {n: dict(sorted(v.items(), key=lambda x: semver_key(x[0]))) for n, v in out.items()}


def check_system_documents(registry, docs) -> list:
    """Located diagnostics of every system document whose chip the registry (with this import's
    chips) lacks, or whose chip states no links the system does not state either."""
    from torchfl.hcd.system import check_system_text

    catalog = _with_batch(registry.chip_catalog(), docs)
    out = []
    for d in docs:
        if d.kind == "system":
            out += [x for x in check_system_text(d.source, d.file, catalog).diagnostics if x.severity == "error"]
    return out


def looks_like_file(spec: str) -> bool:
    return spec.endswith((".yaml", ".yml")) or "/" in spec or Path(spec).is_file()


def load_system_spec(registry, spec: str):
    """The System that ``spec`` names: a system file (checked against the registry's chips) or
    a published system ``NAME`` / ``NAME@VERSION``. Raises HCDError (located) for a bad file,
    NotFound (with did-you-mean) for an unknown name."""
    from torchfl.hcd.system import load_system

    if looks_like_file(spec):
        return load_system(spec, registry.chip_catalog())
    name, _, version = spec.partition("@")
    return registry.system(name, version or None)
