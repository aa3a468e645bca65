"""Registry errors: each says what failed, on which registry URL, and what to do.

``exit_code`` is what the CLI exits with: 1 when the user's *content* is refused
(invalid files, an immutable version changed, an unknown chip), 2 when the registry
itself cannot be used (unreachable, not a registry, read-only, wrong schema).
"""

from __future__ import annotations


class RegistryError(Exception):
    """Base class; ``str()`` is one line for the user."""

    exit_code = 2


class RegistryUnavailable(RegistryError):
    """The URL cannot be opened or reached, or is not usable as a registry."""


class SchemaMismatch(RegistryError):
    """The registry's schema revision differs from this torchfl's."""


class NotFound(RegistryError):
    """No such chip, rule pack or version."""

    exit_code = 1


class ImportRefused(RegistryError):
    """An import wrote nothing: some file is invalid, or a published version would change.

    ``diagnostics`` holds located file problems; ``conflicts`` the immutability refusals.
    """

    exit_code = 1

    def __init__(self, message: str, diagnostics=(), conflicts=()):
        super().__init__(message)
        self.diagnostics = list(diagnostics)
        self.conflicts = list(conflicts)
