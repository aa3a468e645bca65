"""sweeps: a run fanned out over workers, each unit's result written once, the run's finish

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06

Frozen: this file states the schema as of revision 0007 and never imports the models.
``(run_id, unit)`` is unique, so a unit retried after a worker died writes nothing twice
(the writer inserts with ``ON CONFLICT DO NOTHING``); ``sweep_finishes.run_id`` is unique,
so a run is finished once. Rows are append-only like the evidence (revision 0005): the database
refuses UPDATE, DELETE and (PostgreSQL) TRUNCATE, through the dialect's ``append_only_sql``.
"""

from alembic import op
import sqlalchemy as sa

from torchfl.registry.dialects import dialect_for

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TABLES = ("sweep_runs", "sweep_units", "sweep_finishes")
MESSAGE = "sweep results are written once and never edited"


def upgrade() -> None:
    op.create_table(
        "sweep_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("spec_hash", sa.String(length=64), nullable=False),
        sa.Column("units", sa.Text(), nullable=False),
        sa.Column("unit_count", sa.Integer(), nullable=False),
        sa.Column("tool_version", sa.String(length=32), nullable=False),
        sa.Column("driver", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sweep_runs"),
    )
    op.create_index("ix_sweep_runs_kind", "sweep_runs", ["kind"])
    op.create_table(
        "sweep_units",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("unit", sa.String(length=400), nullable=False),
        sa.Column("result", sa.Text(), nullable=False),
        sa.Column("node", sa.String(length=200), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["sweep_runs.id"], name="fk_sweep_units_run_id_sweep_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_sweep_units"),
        sa.UniqueConstraint("run_id", "unit", name="uq_sweep_units_run_id_unit"),
    )
    op.create_table(
        "sweep_finishes",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["sweep_runs.id"], name="fk_sweep_finishes_run_id_sweep_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_sweep_finishes"),
        sa.UniqueConstraint("run_id", name="uq_sweep_finishes_run_id"),
    )
    dialect = dialect_for(op.get_bind().dialect.name)
    for table in TABLES:
        for statement in dialect.append_only_sql(table, MESSAGE):   # the evidence tables' way (0005)
            op.execute(statement)


def downgrade() -> None:
    dialect = dialect_for(op.get_bind().dialect.name)
    for table in reversed(TABLES):   # the refusal function stays: 0005's evidence tables use it
        for statement in dialect.drop_append_only_sql(table):
            op.execute(statement)
    op.drop_table("sweep_finishes")
    op.drop_table("sweep_units")
    op.drop_index("ix_sweep_runs_kind", table_name="sweep_runs")
    op.drop_table("sweep_runs")
