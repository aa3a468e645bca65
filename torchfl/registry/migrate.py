"""Alembic, configured in code from the migrations bundled with torchfl.

``script_location`` comes from :func:`torchfl.resources.bundled_path`, so the same calls
work in a checkout and from an installed wheel. Alembic is imported only here, and only
by ``init``/``upgrade``, keeping it off the path of ordinary queries.
"""

from __future__ import annotations

from torchfl.resources import bundled_path


def alembic_config(connection=None):
    from alembic.config import Config

    cfg = Config(str(bundled_path("alembic.ini")))
    cfg.set_main_option("script_location", str(bundled_path("migrations")).replace("%", "%%"))
    cfg.attributes["connection"] = connection
    return cfg


def upgrade(connection, target: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(connection), target)


def downgrade(connection, target: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(connection), target)


def script_head() -> str:
    """The head revision of the bundled migration scripts."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection) -> str | None:
    """The registry's revision; None when it has no Alembic version table (not a registry).

    Runs in a savepoint-free probe: callers give it a connection not yet inside a write.
    """
    from sqlalchemy import inspect, text

    if not inspect(connection).has_table("alembic_version"):
        return None
    row = connection.execute(text("SELECT version_num FROM alembic_version")).first()
    return row[0] if row else ""


def is_empty(connection) -> bool:
    """True when the database holds no table at all (a fresh or emptied database)."""
    from sqlalchemy import inspect

    return not inspect(connection).get_table_names()
