"""systems: published system descriptors (N chips of one HCD, topology, host links), immutable

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-08

Frozen: this file states the schema as of revision 0008 and never imports the models.
A published (name, version) never changes: the database refuses UPDATE and DELETE of a row
(and TRUNCATE on PostgreSQL), through the dialect's ``protect_rows_sql`` as revision 0004
does for chips and rule packs.
"""

from alembic import op
import sqlalchemy as sa

from torchfl.registry.dialects import dialect_for

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TABLE = "system_versions"
MESSAGE = "a published version never changes; publish a new version"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("chip_name", sa.String(length=64), nullable=False),
        sa.Column("chip_version", sa.String(length=128), nullable=True),
        sa.Column("chip_count", sa.Integer(), nullable=False),
        sa.Column("source_name", sa.String(length=1024), nullable=False),
        sa.Column("source_text", sa.Text(), nullable=False),
        sa.Column("canonical_json", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("imported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("import_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["import_id"], ["imports.id"], name="fk_system_versions_import_id_imports"),
        sa.PrimaryKeyConstraint("id", name="pk_system_versions"),
        sa.UniqueConstraint("name", "version", name="uq_system_versions_name_version"),
    )
    op.create_index("ix_system_versions_chip_name", TABLE, ["chip_name"])
    for statement in dialect_for(op.get_bind().dialect.name).protect_rows_sql(TABLE, MESSAGE):
        op.execute(statement)


def downgrade() -> None:
    for statement in dialect_for(op.get_bind().dialect.name).unprotect_rows_sql(TABLE):
        op.execute(statement)
    op.drop_index("ix_system_versions_chip_name", table_name=TABLE)
    op.drop_table(TABLE)
