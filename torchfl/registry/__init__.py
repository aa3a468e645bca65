"""The versioned registry of chips (HCDs) and rule packs, on SQLite or PostgreSQL.

    from torchfl.registry import Registry
    reg = Registry()                    # TORCHFL_REGISTRY_URL, else the user's default
    reg.import_files(["my_chip.hcd"])   # all or nothing; published versions are immutable
    hcd = reg.chip("NPU-V3")            # latest by semver

Schema changes go through Alembic only (``migrations/``); see ``api.py`` for the rules.
"""

from torchfl.registry.api import Registry, open_registry
from torchfl.registry.diff import Change
from torchfl.registry.errors import ImportRefused, NotFound, RegistryError, RegistryUnavailable, SchemaMismatch
from torchfl.registry.records import ImportResult, Listing, StoredVersion, VersionInfo
from torchfl.registry.results import Conflict, Outcome

__all__ = [
    "Change", "Conflict", "ImportRefused", "ImportResult", "Listing", "NotFound", "Outcome", "Registry",
    "RegistryError", "RegistryUnavailable", "SchemaMismatch", "StoredVersion", "VersionInfo",
    "open_registry",
]
