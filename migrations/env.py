"""Alembic environment of the torchfl registry.

torchfl passes an open connection in ``config.attributes["connection"]`` (see
``torchfl/registry/migrate.py``); run from the command line, the URL comes from
``TORCHFL_REGISTRY_URL`` or the user's default registry.
"""

from logging.config import fileConfig

from alembic import context

from torchfl.registry.schema import metadata

config = context.config


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    from torchfl.registry.url import resolve_url

    context.configure(url=config.get_main_option("sqlalchemy.url") or resolve_url(None)[0],
                      target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    from torchfl.registry.engine import WRITE, create_registry_engine
    from torchfl.registry.url import resolve_url

    if config.config_file_name:
        fileConfig(config.config_file_name)
    engine = create_registry_engine(config.get_main_option("sqlalchemy.url") or resolve_url(None)[0])
    with engine.connect() as conn:
        conn = conn.execution_options(**WRITE)
        with conn.begin():
            _configure(conn)
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
