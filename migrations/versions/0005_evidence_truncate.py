"""evidence tables refuse TRUNCATE too, and say what they hold

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06

Revision 0003 made the evidence tables append-only with row triggers; PostgreSQL's row
triggers do not see ``TRUNCATE``, so ``TRUNCATE conformance_results`` (or
``conformance_runs CASCADE``) wiped every run silently, and the refusal of an edit said "a
published version never changes" (the message of chips and packs). Each evidence table now
refuses UPDATE, DELETE and TRUNCATE with "evidence is never edited; a newer run supersedes
it". The DDL is the registry dialect's (``torchfl/registry/dialects/``); on SQLite (no
TRUNCATE; its messages were right) the triggers are recreated as they were.
"""

from alembic import op

from torchfl.registry.dialects import dialect_for

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLES = ("conformance_runs", "conformance_results", "route_runs", "route_counts")
MESSAGE = "evidence is never edited; a newer run supersedes it"


def upgrade() -> None:
    dialect = dialect_for(op.get_bind().dialect.name)
    for table in TABLES:
        for statement in dialect.append_only_sql(table, MESSAGE):
            op.execute(statement)


def downgrade() -> None:
    """Back to revision 0003's triggers (row UPDATE/DELETE only)."""
    name = op.get_bind().dialect.name
    dialect = dialect_for(name)
    for table in TABLES:
        for statement in dialect.drop_append_only_sql(table):
            op.execute(statement)
        if name == "postgresql":
            op.execute(f"CREATE TRIGGER trg_{table}_immutable BEFORE UPDATE OR DELETE ON {table} "
                       "FOR EACH ROW EXECUTE FUNCTION torchfl_refuse_update()")
        else:
            for statement in dialect.protect_rows_sql(table, MESSAGE):
                op.execute(statement)
    for statement in dialect.drop_refusal_function_sql():
        op.execute(statement)
