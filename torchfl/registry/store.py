"""The import transaction: insert-if-absent, then compare, all in one transaction.

No read-then-write race: rows go in with ``INSERT ... ON CONFLICT (name, version) DO
NOTHING`` (both backends; the dialect builds it), and only afterwards do we read back who owns each
(name, version). A row owned by this import was added; one owned by another import is
``unchanged`` when its hash matches and a refusal when it does not, which rolls the
whole transaction back. On PostgreSQL a concurrent insert of the same key waits for the
other transaction and then sees its committed row (READ COMMITTED); rows are inserted in
sorted order so two imports never lock keys in opposite orders. On SQLite, writers are
serialised by ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

from datetime import datetime, timezone

from torchfl.registry.results import Conflict, Outcome
from torchfl.registry.schema import TABLES, imports

CHUNK = 200


def write(conn, docs, *, tool_version: str, progress=None) -> tuple[list[Outcome], list[Conflict]]:
    """Insert ``docs`` inside the caller's transaction. The caller rolls back on conflicts."""
    from sqlalchemy import insert, select

    from torchfl.registry.dialects import dialect_for

    dialect = dialect_for(conn.dialect.name)

    now = datetime.now(timezone.utc)
    import_id = conn.execute(
        insert(imports).values(imported_at=now, tool_version=tool_version, files=len(docs)).returning(imports.c.id)
    ).scalar_one()
    outcomes: list[Outcome] = []
    conflicts: list[Conflict] = []
    total, done = len(docs), 0
    if progress:
        progress("writing", 0, total)
    for kind, table in TABLES.items():
        mine = sorted((d for d in docs if d.kind == kind), key=lambda d: (d.name, d.version))
        if not mine:
            continue
        if kind == "system":
            _require_chips(conn, mine)
        rows = [dict(name=d.name, version=d.version, source_name=d.file, source_text=d.source,
                     canonical_json=d.canonical_json, content_hash=d.content_hash, imported_at=now,
                     import_id=import_id, **d.extra) for d in mine]
        stmt = dialect.insert_ignore(table)
        for start in range(0, len(rows), CHUNK):
            conn.execute(stmt, rows[start:start + CHUNK])
            done += len(rows[start:start + CHUNK])
            if progress:
                progress("writing", done, total)
        stored: dict[tuple, tuple] = {}
        names = sorted({d.name for d in mine})
        for start in range(0, len(names), CHUNK):
            q = select(table.c.name, table.c.version, table.c.content_hash, table.c.import_id).where(
                table.c.name.in_(names[start:start + CHUNK]))
            for name, version, digest, owner in conn.execute(q):
                stored[(name, version)] = (digest, owner)
        for d in mine:
            digest, owner = stored[(d.name, d.version)]
            if owner == import_id:
                outcomes.append(Outcome(kind, d.name, d.version, d.content_hash, d.file, "added"))
            elif digest == d.content_hash:
                outcomes.append(Outcome(kind, d.name, d.version, d.content_hash, d.file, "unchanged"))
            else:
                conflicts.append(Conflict(kind, d.name, d.version, d.file, digest, d.content_hash))
    if not conflicts and not any(o.status == "added" for o in outcomes):
        from sqlalchemy import delete

        conn.execute(delete(imports).where(imports.c.id == import_id))
    return outcomes, conflicts


def _require_chips(conn, systems) -> None:
    """Each system's chip (and version, when it names one) is published, in this transaction:
    the check before the transaction (``registry.systems``) cannot see a chip deleted or a
    registry swapped in between. Raises ImportRefused, which rolls the import back."""
    from sqlalchemy import select

    from torchfl.registry.errors import ImportRefused
    from torchfl.registry.schema import chip_versions

    for d in systems:
        name, version = d.extra["chip_name"], d.extra["chip_version"]
        q = select(chip_versions.c.version).where(chip_versions.c.name == name)
        if version is not None:
            q = q.where(chip_versions.c.version == version)
        if conn.execute(q.limit(1)).first() is None:
            chip = f"{name} {version}" if version else name
            raise ImportRefused(f"nothing imported: system {d.name} {d.version} ({d.file}) names chip {chip}, which "
                                "the registry lacks; import its HCD first (torchfl registry import FILE.hcd)")
