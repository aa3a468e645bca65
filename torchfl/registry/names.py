"""Schema facts the read path needs without importing SQLAlchemy (see ``reader.py``).

``schema.py`` builds the SQLAlchemy tables from these names; a test checks they agree
with the Alembic scripts' head.
"""

#: Alembic revisions this code knows, oldest first; the last is the one it writes.
REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008")
HEAD = REVISIONS[-1]
#: what a registry migrated down to base stores: an empty version table
BASE = ""

#: kind -> table of published versions
TABLE_NAMES = {"chip": "chip_versions", "pack": "pack_versions", "system": "system_versions"}

#: evidence tables (revision 0003): conformance runs and their verdicts, model route counts
EVIDENCE_TABLES = ("conformance_runs", "conformance_results", "route_runs", "route_counts")

#: fidelity evidence tables (revision 0006): scored runs and their rows
FIDELITY_TABLES = ("fidelity_runs", "fidelity_rows")

#: sweeps fanned out over workers (revision 0007): the run, each unit's result, the finish
SWEEP_TABLES = ("sweep_runs", "sweep_units", "sweep_finishes")
