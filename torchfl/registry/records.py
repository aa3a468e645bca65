"""What the registry hands out: versions (with or without their content), listings and the
outcome of an import. Plain frozen data, JSON-able through ``as_dict``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class VersionInfo:
    """One published version of a chip or rule pack (without its content)."""

    kind: str
    name: str
    version: str
    content_hash: str
    imported_at: datetime
    import_id: int
    source_name: str

    def as_dict(self) -> dict:
        return dict(kind=self.kind, name=self.name, version=self.version, content_hash=self.content_hash,
                    imported_at=self.imported_at.isoformat(), import_id=self.import_id, source_name=self.source_name)


@dataclass(frozen=True)
class StoredVersion(VersionInfo):
    """A version with its content: the canonical form and the text as imported."""

    canonical: dict = None  # type: ignore[assignment]
    source_text: str = ""

    def as_dict(self) -> dict:
        out = super().as_dict()
        out["canonical"] = self.canonical
        return out


@dataclass(frozen=True)
class Listing:
    """A chip or rule pack with its latest version (what ``chips()`` / ``packs()`` list)."""

    kind: str
    name: str
    latest: str
    versions: tuple[str, ...]
    imported_at: datetime
    device_type: str | None = None
    vendor: str | None = None
    chip: str | None = None       # a system's chip name, and its version (None: the latest)
    chip_version: str | None = None
    count: int | None = None      # a system's number of chips

    def as_dict(self) -> dict:
        out = dict(kind=self.kind, name=self.name, latest=self.latest, versions=list(self.versions),
                   imported_at=self.imported_at.isoformat())
        if self.kind == "chip":
            out.update(device_type=self.device_type, vendor=self.vendor)
        if self.kind == "system":
            out.update(chip=self.chip, chip_version=self.chip_version, count=self.count)
        return out


@dataclass(frozen=True)
class ImportResult:
    outcomes: list
    warnings: list

    @property
    def added(self) -> list:
        return [o for o in self.outcomes if o.status == "added"]

    @property
    def unchanged(self) -> list:
        return [o for o in self.outcomes if o.status == "unchanged"]

    def as_dict(self) -> dict:
        return {"imported": [o.as_dict() for o in self.outcomes],
                "warnings": [str(w) for w in self.warnings],
                "added": len(self.added), "unchanged": len(self.unchanged)}
