"""What an import did with each document, and the refusals (light: no SQLAlchemy)."""

from __future__ import annotations

from dataclasses import dataclass

from torchfl.registry.semver import bump_patch


@dataclass(frozen=True)
class Outcome:
    """What one import did with one document."""

    kind: str
    name: str
    version: str
    content_hash: str
    file: str
    status: str  # "added" | "unchanged"

    def as_dict(self) -> dict:
        return dict(kind=self.kind, name=self.name, version=self.version, content_hash=self.content_hash,
                    file=self.file, status=self.status)


@dataclass(frozen=True)
class Conflict:
    """A published (name, version) whose content this import would change."""

    kind: str
    name: str
    version: str
    file: str
    stored_hash: str
    new_hash: str

    def __str__(self) -> str:
        field = "chip.version" if self.kind == "chip" else "pack.version"
        return (f"{self.file}: {self.kind} {self.name} {self.version} is already published with content "
                f"sha256:{self.stored_hash}; this file's content is sha256:{self.new_hash}. A published version "
                f"is immutable: bump {field} (e.g. to {bump_patch(self.version)}) and import again")

    def as_dict(self) -> dict:
        return dict(kind=self.kind, name=self.name, version=self.version, file=self.file,
                    stored_hash=self.stored_hash, new_hash=self.new_hash)
