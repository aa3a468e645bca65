"""fidelity evidence: runs of `torchfl fidelity --record` and their per-row predictions

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06

Frozen: this file states the schema as of revision 0006 and never imports the models.
A fidelity run scores one chip version's predicted times against published measurements;
like every evidence table its rows are never edited nor deleted (a newer run supersedes them).
"""

from alembic import op
import sqlalchemy as sa

from torchfl.registry.dialects import dialect_for

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TABLES = ("fidelity_runs", "fidelity_rows")
MESSAGE = "evidence is never edited; a newer run supersedes it"


def upgrade() -> None:
    op.create_table(
        "fidelity_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("chip_name", sa.String(length=64), nullable=False),
        sa.Column("chip_version", sa.String(length=128), nullable=False),
        sa.Column("chip_hash", sa.String(length=64), nullable=False),
        sa.Column("packs", sa.Text(), nullable=False),
        sa.Column("tool_version", sa.String(length=32), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tables", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fidelity_runs"),
    )
    op.create_index("ix_fidelity_runs_chip_name", "fidelity_runs", ["chip_name"])
    op.create_table(
        "fidelity_rows",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("table_name", sa.String(length=200), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(length=200), nullable=False),
        sa.Column("family", sa.String(length=64), nullable=False),
        sa.Column("shapes", sa.Text(), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("args", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=200), nullable=False),
        sa.Column("measured_s", sa.Float(), nullable=False),
        sa.Column("predicted_s", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("in_sample", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["fidelity_runs.id"], name="fk_fidelity_rows_run_id_fidelity_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_fidelity_rows"),
        sa.UniqueConstraint("run_id", "table_name", "line", name="uq_fidelity_rows_run_id_table_name_line"),
    )
    dialect = dialect_for(op.get_bind().dialect.name)
    for table in TABLES:   # UPDATE, DELETE and TRUNCATE refused, as revision 0005 does for evidence
        for statement in dialect.append_only_sql(table, MESSAGE):
            op.execute(statement)


def downgrade() -> None:
    dialect = dialect_for(op.get_bind().dialect.name)
    for table in reversed(TABLES):
        for statement in dialect.drop_append_only_sql(table):
            op.execute(statement)
    op.drop_table("fidelity_rows")
    op.drop_index("ix_fidelity_runs_chip_name", table_name="fidelity_runs")
    op.drop_table("fidelity_runs")
