"""Located diagnostics: what is wrong, where (file:line:column, field path), how to fix it.

Every layer that reads a user's file reports through :class:`Diagnostic`, so the CLI
prints one format and ``--json`` has one shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One problem in a file. ``line`` and ``column`` are 1-based; ``path`` is dotted."""

    file: str
    line: int
    column: int
    path: str
    severity: Severity
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}"
        field = f" {self.path}:" if self.path else ""
        return f"{where}: {self.severity}:{field} {self.message}"

    def as_dict(self) -> dict:
        return asdict(self)


def format_path(path: Iterable[object]) -> str:
    """``("compute_units", "fp16", "supported_layouts", 2)`` -> ``compute_units.fp16.supported_layouts[2]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def errors(diagnostics: Iterable[Diagnostic]) -> list[Diagnostic]:
    return [d for d in diagnostics if d.severity == "error"]


@dataclass
class FileReport:
    """Outcome of checking one file (an HCD's :class:`~torchfl.hcd.validate.HCDReport`, a system's
    :class:`~torchfl.hcd.system.SystemReport`): its diagnostics, its text, whether it could be read."""

    file: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    source: str | None = None
    readable: bool = True

    @property
    def ok(self) -> bool:
        return self.readable and not errors(self.diagnostics)


class TorchflInputError(Exception):
    """Bad user input, described by located diagnostics. Never carries a traceback to users."""

    def __init__(self, diagnostics: list[Diagnostic], summary: str | None = None):
        self.diagnostics = sorted(diagnostics)
        first = errors(self.diagnostics)[:1] or self.diagnostics[:1]
        super().__init__(summary or "\n".join(str(d) for d in self.diagnostics) or (str(first[0]) if first else "invalid input"))


class YAMLLoadError(TorchflInputError):
    """A file could not be read as the bounded, safe YAML subset torchfl accepts."""


class HCDError(TorchflInputError):
    """An HCD failed validation; ``.diagnostics`` lists every problem found."""
