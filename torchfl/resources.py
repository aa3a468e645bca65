"""Where the bundled data lives: beside the package in a wheel, at the checkout's top otherwise.

The wheel force-includes ``hcd_registry/``, ``rules/``, ``migrations/`` and
``alembic.ini`` under ``torchfl/_bundled/``; an editable install reads them from the
checkout. Every caller goes through :func:`bundled_path` so both cases stay one code path.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CANDIDATES = (_PACKAGE / "_bundled", _PACKAGE.parent)


def bundled_path(name: str) -> Path:
    """Path of a bundled file or folder (``"hcd_registry"``, ``"rules"``, ``"migrations"``, ``"alembic.ini"``)."""
    for root in _CANDIDATES:
        candidate = root / name
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"bundled data {name!r} is missing from the torchfl installation "
        f"(looked in {', '.join(str(r) for r in _CANDIDATES)}); reinstall torchfl"
    )


def bundled_hcds() -> list[Path]:
    """The reference chips shipped with torchfl, sorted by file name."""
    return sorted(bundled_path("hcd_registry").glob("*.hcd"))


def bundled_rule_packs() -> list[Path]:
    """The rule packs shipped with torchfl, sorted by file name."""
    return sorted(bundled_path("rules").glob("*.yaml"))


def bundled_systems() -> list[Path]:
    """The system descriptors shipped with torchfl (``hcd_registry/systems/*.system.yaml``)."""
    return sorted((bundled_path("hcd_registry") / "systems").glob("*.system.yaml"))


def bundled_fingerprint() -> str:
    """A hash of the bundled chips, rule packs, systems and fidelity runs (names and bytes): it changes
    when an upgrade of torchfl ships new or changed ones, so the default registry can take them in."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    evidence = bundled_path("measurements") / "evidence" / "fidelity_runs.json"
    for path in (bundled_hcds() + bundled_rule_packs() + bundled_systems()
                 + ([evidence] if evidence.is_file() else [])):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()
