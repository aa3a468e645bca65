"""packs: published rule packs, immutable per (name, version) like chips

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

Frozen: this file states the schema as of revision 0002 and never imports the models.
"""

from alembic import op
import sqlalchemy as sa

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pack_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("source_name", sa.String(length=1024), nullable=False),
        sa.Column("source_text", sa.Text(), nullable=False),
        sa.Column("canonical_json", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.String(length=64), nullable=False),
        sa.Column("imported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("import_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["import_id"], ["imports.id"], name="fk_pack_versions_import_id_imports"),
        sa.PrimaryKeyConstraint("id", name="pk_pack_versions"),
        sa.UniqueConstraint("name", "version", name="uq_pack_versions_name_version"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE TRIGGER trg_pack_versions_immutable BEFORE UPDATE ON pack_versions "
                   "FOR EACH ROW EXECUTE FUNCTION torchfl_refuse_update()")
    else:
        op.execute("CREATE TRIGGER trg_pack_versions_immutable BEFORE UPDATE ON pack_versions BEGIN "
                   "SELECT RAISE(ABORT, 'pack_versions rows are immutable: a published version never changes; "
                   "publish a new version'); END")


def downgrade() -> None:
    on = " ON pack_versions" if op.get_bind().dialect.name == "postgresql" else ""
    op.execute(f"DROP TRIGGER IF EXISTS trg_pack_versions_immutable{on}")
    op.drop_table("pack_versions")
