"""The user's default registry (no URL given): created, migrated and seeded on first use, and
refreshed once after an upgrade of torchfl ships other bundled files.

The default registry remembers which bundled chips, packs, systems and fidelity runs it was
seeded with (a fingerprint in a file beside it): after an upgrade ships new ones, the first use
imports them (new versions are added; what the user imported stays, and the latest version by
semver still wins), instead of planning with stale rule packs. Both steps run under a file
lock, so two processes starting at once seed it once.
"""
from __future__ import annotations

import fcntl
import logging
from pathlib import Path

from torchfl.registry.dialects.sqlite import sqlite_file
from torchfl.registry.engine import translated
from torchfl.registry.errors import RegistryError
from torchfl.registry.names import HEAD

__all__ = ["create", "refresh", "stamp_stale", "write_stamp"]


def _stamp_path(registry) -> Path:
    path = Path(sqlite_file(registry.url))
    return path.with_name(path.name + ".bundled")


def stamp_stale(registry) -> bool:
    """Whether the bundled files changed since ``registry`` was last seeded from them."""
    from torchfl.resources import bundled_fingerprint

    try:
        return _stamp_path(registry).read_text().strip() != bundled_fingerprint()
    except OSError:
        return True


def write_stamp(registry) -> None:
    from torchfl.resources import bundled_fingerprint

    try:
        _stamp_path(registry).write_text(bundled_fingerprint() + "\n")
    except OSError:   # a read-only data directory: checked again next time, harmless
        pass


def create(registry) -> None:
    """First use of the default registry: create, migrate and seed it, once, under a file lock."""
    path = Path(sqlite_file(registry.url))
    with translated(registry.url, writing=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "w")
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists() and registry.schema_revision() == HEAD:
            return
        registry.init(seed=True)
        write_stamp(registry)


def refresh(registry) -> None:
    """Import the bundled files this default registry lacks, once per change."""
    path = Path(sqlite_file(registry.url))
    try:
        lock = open(path.with_name(path.name + ".lock"), "w")
    except OSError:
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp_stale(registry) or registry.schema_revision() != HEAD:
            return      # another process did it; an old schema says to upgrade first (the caller)
        registry._schema_ok = "head"
        try:
            result = registry.seed()
        except RegistryError as exc:  # e.g. a bundled version the user re-published differently
            logging.getLogger("torchfl").warning(
                "the default registry %s kept its chips and rule packs: the ones bundled with this "
                "torchfl could not be imported (%s); run `torchfl registry import` to see why",
                registry.display_url, exc)
        else:
            added = [f"{o.kind} {o.name} {o.version}" for o in result.outcomes if o.status != "unchanged"]
            if added:
                logging.getLogger("torchfl").info("default registry %s: imported the bundled %s",
                                                  registry.display_url, ", ".join(added))
        write_stamp(registry)
