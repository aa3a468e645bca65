"""Which registry: ``--registry URL``, else ``TORCHFL_REGISTRY_URL``, else the user's default.

The default is an SQLite file in platformdirs' user data directory, so a fresh install
has a working registry without any configuration.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "TORCHFL_REGISTRY_URL"
DEFAULT_FILE = "registry.sqlite3"


def default_path() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("torchfl", appauthor=False)) / DEFAULT_FILE


def default_url() -> str:
    return f"sqlite:///{default_path()}"


def resolve_url(url: str | None) -> tuple[str, bool]:
    """(url, is_default). An empty string counts as not given."""
    if url:
        return url, False
    env = os.environ.get(ENV_VAR)
    if env:
        return env, False
    return default_url(), True


def display_url(url: str) -> str:
    """The URL with any password hidden, for messages (no SQLAlchemy import)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user, host = parts.netloc.rsplit("@", 1)
        name = user.split(":", 1)[0]
        return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))
    except ValueError:  # not a URL at all: shown as given (nothing parsed, nothing to hide)
        return url
