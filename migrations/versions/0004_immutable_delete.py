"""immutable published versions: the database refuses DELETE (and TRUNCATE) as well as UPDATE

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

Revisions 0001/0002 refused a raw SQL ``UPDATE`` of a published chip or rule pack, but a
``DELETE`` went through. The trigger DDL of each backend is the registry dialect's
(``torchfl/registry/dialects/``), the one place that knows how each spells it.
"""

from alembic import op

from torchfl.registry.dialects import dialect_for

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TABLES = ("chip_versions", "pack_versions")
MESSAGE = "a published version never changes; publish a new version"


def upgrade() -> None:
    dialect = dialect_for(op.get_bind().dialect.name)
    for table in TABLES:
        op.execute(dialect.drop_trigger_sql(table, f"trg_{table}_immutable"))  # UPDATE only (0001, 0002)
        for statement in dialect.unprotect_rows_sql(table) + dialect.protect_rows_sql(table, MESSAGE):
            op.execute(statement)


def downgrade() -> None:
    dialect = dialect_for(op.get_bind().dialect.name)
    for table in TABLES:
        for statement in dialect.unprotect_rows_sql(table):
            op.execute(statement)
        for statement in dialect.protect_rows_sql(table, MESSAGE, events=("UPDATE",)):
            op.execute(statement)
