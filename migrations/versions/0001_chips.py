"""chips: published chip descriptors and the imports that brought them

Revision ID: 0001
Revises:
Create Date: 2026-12-02

Frozen: this file states the schema as of revision 0001 and never imports the models.
"""

from alembic import op
import sqlalchemy as sa

PG_FUNCTION = """
CREATE FUNCTION torchfl_refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable: a published version never changes; publish a new version',
        TG_TABLE_NAME;
END $$
"""


def immutable(table: str) -> None:
    """Refuse UPDATE on a table of published versions, in the database itself."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"CREATE TRIGGER trg_{table}_immutable BEFORE UPDATE ON {table} "
                   "FOR EACH ROW EXECUTE FUNCTION torchfl_refuse_update()")
    else:
        op.execute(f"CREATE TRIGGER trg_{table}_immutable BEFORE UPDATE ON {table} BEGIN "
                   f"SELECT RAISE(ABORT, '{table} rows are immutable: a published version never changes; "
                   "publish a new version'); END")


def drop_immutable(table: str) -> None:
    on = f" ON {table}" if op.get_bind().dialect.name == "postgresql" else ""
    op.execute(f"DROP TRIGGER IF EXISTS trg_{table}_immutable{on}")

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_FUNCTION)
    op.create_table(
        "imports",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("imported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tool_version", sa.String(length=32), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_imports"),
    )
    op.create_table(
        "chip_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("vendor", sa.String(length=200), nullable=False),
        sa.Column("device_type", sa.String(length=32), nullable=False),
        sa.Column("source_name", sa.String(length=1024), nullable=False),
        sa.Column("source_text", sa.Text(), nullable=False),
        sa.Column("canonical_json", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("imported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("import_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["import_id"], ["imports.id"], name="fk_chip_versions_import_id_imports"),
        sa.PrimaryKeyConstraint("id", name="pk_chip_versions"),
        sa.UniqueConstraint("name", "version", name="uq_chip_versions_name_version"),
    )
    op.create_index("ix_chip_versions_device_type", "chip_versions", ["device_type"])
    immutable("chip_versions")


def downgrade() -> None:
    drop_immutable("chip_versions")
    op.drop_index("ix_chip_versions_device_type", table_name="chip_versions")
    op.drop_table("chip_versions")
    op.drop_table("imports")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS torchfl_refuse_update()")
