"""evidence: conformance runs and their per-overload verdicts; route counts of model runs

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04

Frozen: this file states the schema as of revision 0003 and never imports the models.
Evidence rows are facts about one run (chip content hash, rule pack versions, torchfl
version, harness hash): never edited, never deleted; a newer run supersedes them.
"""

from alembic import op
import sqlalchemy as sa

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TABLES = ("conformance_runs", "conformance_results", "route_runs", "route_counts")


def _identity_columns():
    """What a run is tied to: the chip version by content, the packs, torchfl."""
    return [
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("chip_name", sa.String(length=64), nullable=False),
        sa.Column("chip_version", sa.String(length=128), nullable=False),
        sa.Column("chip_hash", sa.String(length=64), nullable=False),
        sa.Column("packs", sa.Text(), nullable=False),
        sa.Column("tool_version", sa.String(length=32), nullable=False),
    ]


def _append_only(table: str) -> None:
    """Refuse UPDATE and DELETE in the database itself (evidence is superseded, not edited)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"CREATE TRIGGER trg_{table}_immutable BEFORE UPDATE OR DELETE ON {table} "
                   "FOR EACH ROW EXECUTE FUNCTION torchfl_refuse_update()")
    else:
        for event in ("UPDATE", "DELETE"):
            op.execute(f"CREATE TRIGGER trg_{table}_{event.lower()} BEFORE {event} ON {table} BEGIN "
                       f"SELECT RAISE(ABORT, '{table} rows are immutable: evidence is never edited; "
                       "a newer run supersedes it'); END")


def _drop_append_only(table: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP TRIGGER IF EXISTS trg_{table}_immutable ON {table}")
    else:
        for event in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS trg_{table}_{event}")


def upgrade() -> None:
    op.create_table(
        "conformance_runs",
        *_identity_columns(),
        sa.Column("harness_hash", sa.String(length=64), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("settings", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_conformance_runs"),
    )
    op.create_index("ix_conformance_runs_chip_name", "conformance_runs", ["chip_name"])
    op.create_table(
        "conformance_results",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(length=200), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("layout", sa.String(length=32), nullable=False),
        sa.Column("verdict", sa.String(length=16), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("passed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("refused", sa.Integer(), nullable=False),
        sa.Column("max_abs_error", sa.Float(), nullable=True),
        sa.Column("max_rel_error", sa.Float(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("first_failure", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["conformance_runs.id"],
                                name="fk_conformance_results_run_id_conformance_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_conformance_results"),
        sa.UniqueConstraint("run_id", "op", "dtype", "layout",
                            name="uq_conformance_results_run_id_op_dtype_layout"),
    )
    op.create_index("ix_conformance_results_op", "conformance_results", ["op"])
    op.create_table(
        "route_runs",
        *_identity_columns(),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("precision", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_route_runs"),
    )
    op.create_index("ix_route_runs_chip_name", "route_runs", ["chip_name"])
    op.create_table(
        "route_counts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(length=200), nullable=False),
        sa.Column("route", sa.String(length=64), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["route_runs.id"], name="fk_route_counts_run_id_route_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_route_counts"),
        sa.UniqueConstraint("run_id", "op", "route", name="uq_route_counts_run_id_op_route"),
    )
    for table in TABLES:
        _append_only(table)


def downgrade() -> None:
    for table in reversed(TABLES):
        _drop_append_only(table)
    op.drop_table("route_counts")
    op.drop_index("ix_route_runs_chip_name", table_name="route_runs")
    op.drop_table("route_runs")
    op.drop_index("ix_conformance_results_op", table_name="conformance_results")
    op.drop_table("conformance_results")
    op.drop_index("ix_conformance_runs_chip_name", table_name="conformance_runs")
    op.drop_table("conformance_runs")
