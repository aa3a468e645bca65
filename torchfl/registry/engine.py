"""Registry URLs and engines, and the translation of driver errors into one-line messages
that name the URL and the fix. What differs between SQLite and PostgreSQL (engine set-up,
locking, reads) is in ``dialects/``.
"""

from __future__ import annotations

import contextlib

from torchfl.registry.errors import RegistryError, RegistryUnavailable
from torchfl.registry.url import display_url

BUSY_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5
WRITE = {"torchfl_write": True}

_HELP_URL = "set it with --registry URL or TORCHFL_REGISTRY_URL (sqlite:///PATH or postgresql://USER@HOST:PORT/DB)"


def parse_url(url: str):
    """A SQLAlchemy URL for a supported backend, or RegistryUnavailable."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        u = make_url(url)
    except ArgumentError:
        raise RegistryUnavailable(f"{url!r} is not a database URL; {_HELP_URL}") from None
    backend = u.get_backend_name()
    if backend == "postgresql":
        if u.drivername in ("postgresql", "postgresql+psycopg2"):
            u = u.set(drivername="postgresql+psycopg")
    elif backend != "sqlite":
        raise RegistryUnavailable(
            f"registry {display_url(url)}: the {backend!r} backend is not supported; "
            f"use SQLite or PostgreSQL ({_HELP_URL})")
    return u


def backend_of(url: str) -> str:
    """``sqlite`` / ``postgresql`` / other, from the URL's scheme, without importing SQLAlchemy."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    return scheme.split("+", 1)[0].lower()


def check_url(url: str) -> str:
    """The backend of a supported URL, or RegistryUnavailable (SQLAlchemy parses only odd ones)."""
    from torchfl.registry.dialects.sqlite import sqlite_file

    backend = backend_of(url)
    if backend == "sqlite" and "://" in url and sqlite_file(url) is None:
        raise RegistryUnavailable(
            f"{url!r} is an in-memory SQLite database, which vanishes with each connection; "
            "give a file: sqlite:///PATH")
    if backend in ("sqlite", "postgresql") and "://" in url:
        return backend
    return parse_url(url).get_backend_name()  # raises the helpful error


def create_registry_engine(url: str):
    """A SQLAlchemy engine for writes and migrations, set up by the URL's dialect."""
    from torchfl.registry.dialects import dialect_for

    u = parse_url(url)
    return dialect_for(u.get_backend_name()).create_engine(u)


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0].strip() if text else type(orig).__name__


def explain_db_error(exc: BaseException, url: str, *, writing: bool) -> RegistryError:
    """Turn a driver error into a RegistryUnavailable with a fix."""
    shown = display_url(url)
    detail = _first_line(exc)
    low = detail.lower()
    if "readonly" in low or "read-only" in low or "read only" in low:
        return RegistryUnavailable(
            f"registry {shown} is read-only ({detail}); make the file and its directory writable, "
            f"or {'write to' if writing else 'use'} another registry with --registry URL")
    if "permission denied" in low or "insufficient privilege" in low or "insufficientprivilege" in low:
        return RegistryUnavailable(
            f"registry {shown} is read-only for this user ({detail}); ask its owner for write access, "
            f"or {'write to' if writing else 'use'} another registry with --registry URL")
    if "file is not a database" in low or "not a database" in low:
        return RegistryUnavailable(
            f"{shown} is not a torchfl registry (not an SQLite database); point --registry at a "
            "registry, or create a new one with `torchfl registry init --registry sqlite:///NEW.sqlite3`")
    if "unable to open database file" in low:
        return RegistryUnavailable(
            f"cannot open registry {shown} ({detail}); check that its directory exists and is accessible, "
            f"or create it with `torchfl registry init --registry {shown}`")
    if "database is locked" in low or "database is busy" in low:
        return RegistryUnavailable(
            f"registry {shown} stayed locked by another process for {BUSY_TIMEOUT_S:.0f} s; retry when it is done")
    if "disk i/o error" in low or "database disk image is malformed" in low:
        return RegistryUnavailable(
            f"registry {shown} is damaged or unreadable ({detail}); restore it from a backup")
    if "does not exist" in low and "database" in low:
        return RegistryUnavailable(
            f"registry {shown}: {detail}; create the database (createdb) and run "
            f"`torchfl registry init --registry {shown}`")
    if "connect" in low or "connection" in low or "timeout" in low or "resolve" in low or "password" in low:
        return RegistryUnavailable(
            f"cannot connect to registry {shown} ({detail}); check that the server is running and the URL "
            f"(host, port, user, database); {_HELP_URL}")
    return RegistryUnavailable(f"registry {shown}: database error ({detail}); check the URL; {_HELP_URL}")


def _db_errors() -> tuple:
    """The database drivers' error types (those of SQLAlchemy and psycopg once imported)."""
    import sqlite3
    import sys

    kinds = [sqlite3.Error]
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is not None:
        kinds.append(sa_exc.SQLAlchemyError)
    pg = sys.modules.get("psycopg")
    if pg is not None:
        kinds.append(pg.Error)
    return tuple(kinds)


@contextlib.contextmanager
def translated(url: str, *, writing: bool = False):
    """Run a block, re-raising database and OS errors as one-line RegistryErrors."""
    try:
        yield
    except RegistryError:
        raise
    except PermissionError as exc:
        raise RegistryUnavailable(
            f"registry {display_url(url)}: permission denied ({exc.filename or exc}); "
            "make it accessible or use another registry with --registry URL") from None
    except OSError as exc:
        raise RegistryUnavailable(
            f"registry {display_url(url)}: {exc.strerror or exc} ({exc.filename or 'file system'}); check the "
            "path and its permissions, or use another registry with --registry URL") from None
    except _db_errors() as exc:
        raise explain_db_error(exc, url, writing=writing) from None


