"""``Registry(url)``: the versioned store of chips and rule packs. The CLI is a thin face on it.

Every method opens its own short transaction. Reads check once per instance that the
schema revision is the one this code knows (older: run ``torchfl registry upgrade``;
newer: reads allowed, writes refused). The default registry (no URL given) is created,
migrated and seeded with the bundled chips and rule packs on first use.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Iterable

from torchfl.registry import default_registry
from torchfl.registry.dialects import dialect_for
from torchfl.registry.records import ImportResult, Listing, StoredVersion, VersionInfo
from torchfl.registry.engine import WRITE, check_url, create_registry_engine, translated
from torchfl.registry.reader import timestamp
from torchfl.registry.errors import ImportRefused, NotFound, RegistryUnavailable, SchemaMismatch
from torchfl.registry.names import BASE, HEAD, REVISIONS, TABLE_NAMES
from torchfl.registry.semver import semver_key
from torchfl.registry.url import display_url, resolve_url


def _tool_version() -> str:
    from torchfl.version import __version__

    return __version__


class Registry:
    """A registry at ``url`` (``None``: ``TORCHFL_REGISTRY_URL``, else the user's default SQLite file)."""

    def __init__(self, url: str | None = None):
        self.url, self.is_default = resolve_url(url)
        self.backend = check_url(self.url)
        self.dialect = dialect_for(self.backend)
        self._engine = None
        self._reads = None  # the dialect's read session (PostgreSQL keeps a connection open)
        self._schema_ok: str | None = None  # "head" or "newer" once checked

    # ------------------------------------------------------------------ plumbing

    @property
    def display_url(self) -> str:
        return display_url(self.url)

    def close(self) -> None:
        if self._reads is not None:
            self._reads.close()
            self._reads = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _eng(self):
        if self._engine is None:
            self._engine = create_registry_engine(self.url)
        return self._engine

    def _missing_error(self) -> RegistryUnavailable:
        return RegistryUnavailable(
            f"no registry at {self.display_url} (the file does not exist); create it with "
            f"`torchfl registry init --registry {self.display_url}`, or check the path")

    @contextlib.contextmanager
    def _reader(self):
        """A read transaction straight on the driver (sqlite3 or psycopg): no SQLAlchemy import."""
        with translated(self.url):
            if self._reads is None:
                self._reads = self.dialect.read_session(self.url)
            with self._reads.transaction() as reader:
                yield reader

    @contextlib.contextmanager
    def _read(self):
        self._ready(writing=False)
        with self._reader() as reader:
            yield reader

    @contextlib.contextmanager
    def _write(self):
        self.dialect.check_writable(self.url)
        self._ready(writing=True)
        with translated(self.url, writing=True), self._eng().connect() as conn:
            conn = conn.execution_options(**WRITE)
            with conn.begin():
                yield conn

    def _ready(self, *, writing: bool) -> None:
        """Create the default registry on first use; check the schema revision once."""
        if self._schema_ok == "head" or (self._schema_ok == "newer" and not writing):
            return
        if self.is_default and (self.dialect.missing(self.url) or self.schema_revision() is None):
            default_registry.create(self)
        elif self.is_default and default_registry.stamp_stale(self):
            default_registry.refresh(self)
        revision = self.schema_revision()
        if self.is_default and (revision in REVISIONS or revision == BASE) and revision != HEAD:
            self.upgrade()  # torchfl owns its default registry: bring it to this version's schema
            revision = self.schema_revision()
        if revision is None:
            raise RegistryUnavailable(
                f"{self.display_url} is not a torchfl registry (it has no schema version table); point --registry "
                f"at a registry, or create one with `torchfl registry init --registry URL`")
        if revision == HEAD:
            self._schema_ok = "head"
        elif revision == BASE:
            raise SchemaMismatch(
                f"registry {self.display_url} has no schema (an empty version table: migrated down to base); "
                f"run `torchfl registry upgrade --registry {self.display_url}`")
        elif revision in REVISIONS:
            raise SchemaMismatch(
                f"registry {self.display_url} has schema revision {revision}, older than this torchfl's {HEAD}; "
                f"run `torchfl registry upgrade --registry {self.display_url}`")
        else:
            self._schema_ok = "newer"
            if writing:
                raise SchemaMismatch(
                    f"registry {self.display_url} has schema revision {revision!r}, newer than this torchfl "
                    f"knows ({HEAD}); refusing to write: upgrade torchfl (pip install -U torchfl)")

    # ------------------------------------------------------------------ schema

    def schema_revision(self) -> str | None:
        """The stored Alembic revision, None if the database is not a registry."""
        with self._reader() as reader:
            return reader.revision()

    def init(self, *, seed: bool = False) -> dict:
        """Create (or bring to head) the schema; optionally import the bundled chips and rule packs."""
        before = self.upgrade(create=True)
        seeded = self.seed().as_dict() if seed else None
        return {"url": self.display_url, "from": before, "to": HEAD, "seeded": seeded}

    def upgrade(self, *, create: bool = False) -> str | None:
        """Migrate to the head revision with Alembic; returns the revision it started from.

        Any revision this torchfl knows is migrated, and so is a registry without one: an
        empty version table (``alembic downgrade base``, returned as ``""``) or, with
        ``create`` or when the database holds no table at all, no version table (None).
        """
        from torchfl.registry.migrate import current_revision, is_empty, upgrade

        if self.dialect.missing(self.url):
            if not create:
                raise self._missing_error()
            with translated(self.url, writing=True):
                self.dialect.create_location(self.url)
        with translated(self.url, writing=True), self._eng().connect() as conn:
            conn = conn.execution_options(**WRITE)
            with conn.begin():
                self.dialect.serialize_migrations(conn)  # two inits at once: the second waits, then sees head
                before = current_revision(conn)
                if before not in (None, BASE) and before not in REVISIONS:
                    raise SchemaMismatch(
                        f"registry {self.display_url} has schema revision {before!r}, newer than this torchfl "
                        f"knows ({HEAD}); upgrade torchfl instead")
                if before is None and not create and not is_empty(conn):
                    raise RegistryUnavailable(
                        f"{self.display_url} is not a torchfl registry; create one with "
                        f"`torchfl registry init --registry {self.display_url}`")
                if before != HEAD:
                    upgrade(conn, "head")
        self._schema_ok = "head"
        return before

    def seed(self) -> ImportResult:
        """Import the chips and rule packs bundled with torchfl, and the fidelity runs that
        check them (``bundled_evidence``).

        A bundled file that fails validation is a packaging bug; it is skipped with an
        error-severity entry in ``warnings`` rather than keeping the registry unusable.
        """
        from torchfl.hcd.diagnostics import errors
        from torchfl.registry.documents import load_documents
        from torchfl.resources import bundled_hcds, bundled_rule_packs, bundled_systems

        files = [str(p) for p in bundled_hcds() + bundled_rule_packs() + bundled_systems()]
        docs, diagnostics = load_documents(files)
        broken = {d.file for d in errors(diagnostics)}
        result = self._store([d for d in docs if d.file not in broken],
                             [d for d in diagnostics if d.file not in broken])
        from torchfl.registry.bundled_evidence import seed_fidelity

        seed_fidelity(self)   # the bundled chips' fidelity runs: their out-of-sample check, once
        return ImportResult(result.outcomes, result.warnings + [d for d in diagnostics if d.file in broken])

    # ------------------------------------------------------------------ import

    def import_files(self, paths: Iterable[str | os.PathLike], *, progress=None) -> ImportResult:
        """Validate every file, then store them all in one transaction, or nothing.

        A directory stands for the *.hcd, *.yaml and *.yml files in it. Raises ImportRefused
        (nothing written) if no file is named, any file is invalid or would change a
        published version. ``progress(stage, done, total)``, if given, is called with
        stage ``"validating"`` per file and ``"writing"`` per batch of rows.
        """
        from torchfl.registry.documents import expand_paths, load_documents

        paths = expand_paths(paths)
        if not paths:
            raise ImportRefused("nothing imported: no file given; name HCD (*.hcd) and rule pack (*.yaml) files, "
                                "or a directory holding them")
        docs, diagnostics = load_documents(paths, progress)
        return self._store(docs, diagnostics, progress=progress)

    def import_texts(self, items: Iterable[tuple[str, str]], *, progress=None) -> ImportResult:
        """Like :meth:`import_files` for HCD source held in memory: ``(filename, text)`` pairs."""
        from torchfl.registry.documents import document_from_hcd_text, unique

        found, diagnostics = [], []
        for filename, text in items:
            doc, diags = document_from_hcd_text(text, filename)
            diagnostics.extend(diags)
            if doc is not None:
                found.append(doc)
        docs, clashes = unique(found)
        return self._store(docs, diagnostics + clashes, progress=progress)

    def _store(self, docs, diagnostics, *, progress=None) -> ImportResult:
        from torchfl.hcd.diagnostics import errors

        from torchfl.registry import store

        bad = errors(diagnostics)
        if bad:
            files = sorted({d.file for d in bad})
            raise ImportRefused(f"nothing imported: {len(files)} invalid file(s): {', '.join(files)}",
                                diagnostics=sorted(diagnostics))
        if not docs:
            return ImportResult([], sorted(diagnostics))
        if any(d.kind == "system" for d in docs):
            from torchfl.registry.systems import check_system_documents

            located = check_system_documents(self, docs)   # each system's chip: in the registry or this import
            if errors(located):
                files = sorted({d.file for d in errors(located)})
                raise ImportRefused(f"nothing imported: {len(files)} system(s) name a chip the registry lacks: "
                                    f"{', '.join(files)}", diagnostics=sorted(diagnostics + located))
        for attempt in range(3):
            try:
                with self._write() as conn:
                    outcomes, conflicts = store.write(conn, docs, tool_version=_tool_version(), progress=progress)
                    if conflicts:
                        raise ImportRefused(
                            f"nothing imported: {len(conflicts)} published version(s) would change",
                            diagnostics=sorted(diagnostics), conflicts=conflicts)
                return ImportResult(outcomes, sorted(diagnostics))
            except RegistryUnavailable as exc:
                # PostgreSQL may abort one of two crossing transactions; run it again.
                if attempt < 2 and ("deadlock" in str(exc) or "could not serialize" in str(exc)):
                    continue
                raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ queries

    def _summaries(self, kind: str) -> list[Listing]:
        table = TABLE_NAMES[kind]
        extra_cols = {"chip": ", device_type, vendor", "system": ", chip_name, chip_version, chip_count"}.get(kind, "")
        by_name: dict[str, list] = {}
        with self._read() as r:
            for row in r.rows(f"SELECT name, version, imported_at{extra_cols} FROM {table}"):
                by_name.setdefault(row[0], []).append(row)
        out = []
        for name in sorted(by_name):
            rows = sorted(by_name[name], key=lambda row: semver_key(row[1]))
            top = rows[-1]
            extra = {"device_type": top[3], "vendor": top[4]} if kind == "chip" else {}
            if kind == "system":
                extra = {"chip": top[3], "chip_version": top[4], "count": top[5]}
            out.append(Listing(kind, name, top[1], tuple(row[1] for row in rows), timestamp(top[2]), **extra))
        return out

    def chips(self) -> list[Listing]:
        """Every chip with its latest version (by semver), sorted by name."""
        return self._summaries("chip")

    def packs(self) -> list[Listing]:
        """Every rule pack with its latest version, sorted by name."""
        return self._summaries("pack")

    def systems(self) -> list[Listing]:
        """Every system descriptor with its latest version, sorted by name."""
        return self._summaries("system")

    def system(self, name: str, version: str | None = None):
        """A :class:`~torchfl.hcd.system.System` (latest by semver when ``version`` is None)."""
        from torchfl.hcd.system import System

        rec = self.record(name, version, kind="system")
        return System.model_validate_json(json.dumps(rec.canonical))

    def chip_catalog(self) -> dict[str, dict[str, bool]]:
        """chip name -> {version: whether its HCD states an interconnect}, versions oldest first
        (what a system descriptor is checked against)."""
        by_name: dict[str, list] = {}
        with self._read() as r:
            for name, version, canonical in r.rows(f"SELECT name, version, canonical_json FROM {TABLE_NAMES['chip']}"):
                by_name.setdefault(name, []).append((version, "interconnect" in json.loads(canonical)))
        return {n: dict(sorted(v, key=lambda x: semver_key(x[0]))) for n, v in by_name.items()}

    def history(self, name: str, *, kind: str = "chip") -> list[VersionInfo]:
        """The published versions of a chip (or pack), oldest first by semver."""
        table = TABLE_NAMES[kind]
        with self._read() as r:
            rows = r.rows(f"SELECT name, version, content_hash, imported_at, import_id, source_name FROM {table} "
                          "WHERE name = ?", (name,))
            if not rows:
                raise self._not_found(r, kind, name)
        infos = [VersionInfo(kind, row[0], row[1], row[2], timestamp(row[3]), row[4], row[5]) for row in rows]
        return sorted(infos, key=lambda i: semver_key(i.version))

    def record(self, name: str, version: str | None = None, *, kind: str = "chip") -> StoredVersion:
        """One version with its content; the latest by semver when ``version`` is None."""
        table = TABLE_NAMES[kind]
        with self._read() as r:
            versions = [row[0] for row in r.rows(f"SELECT version FROM {table} WHERE name = ?", (name,))]
            if not versions:
                raise self._not_found(r, kind, name)
            if version is None:
                version = max(versions, key=semver_key)
            elif version not in versions:
                known = ", ".join(sorted(versions, key=semver_key))
                raise NotFound(f"{kind} {name} has no version {version} in {self.display_url}; it has {known}")
            row = r.first(f"SELECT name, version, content_hash, imported_at, import_id, source_name, canonical_json, "
                          f"source_text FROM {table} WHERE name = ? AND version = ?", (name, version))
        return StoredVersion(kind, row[0], row[1], row[2], timestamp(row[3]), row[4], row[5],
                      canonical=json.loads(row[6]), source_text=row[7])

    def chip(self, name: str, version: str | None = None):
        """The HCD of a chip (latest by semver when ``version`` is None)."""
        from torchfl.hcd import HCD, check_hcd_text

        rec = self.record(name, version)
        report = check_hcd_text(rec.source_text, f"{rec.name}@{rec.version}")
        if report.ok and report.hcd is not None and report.hcd.content_hash() == rec.content_hash:
            return report.hcd  # keeps the validation warnings
        return HCD.model_validate_json(json.dumps(rec.canonical))

    def pack(self, name: str, version: str | None = None):
        """A rule pack (latest by semver when ``version`` is None), parsed by torchfl.rules."""
        rec = self.record(name, version, kind="pack")
        from torchfl.rules import load_pack_text  # type: ignore[attr-defined]

        return load_pack_text(rec.source_text, f"{rec.name}@{rec.version}")

    def diff(self, name: str, v1: str, v2: str, *, kind: str = "chip") -> list:
        """Field-level changes from version ``v1`` to ``v2`` (dotted paths)."""
        from torchfl.registry.diff import diff

        return diff(self.record(name, v1, kind=kind).canonical, self.record(name, v2, kind=kind).canonical)

    # ------------------------------------------------------------------ evidence (see evidence.py)

    def identity(self, chip: str, version: str | None = None):
        """The :class:`~torchfl.registry.evidence.RunIdentity` of a chip version with the latest packs."""
        from torchfl.registry.evidence import RunIdentity

        rec = self.record(chip, version)
        packs = tuple(sorted((s.name, s.latest, self.record(s.name, s.latest, kind="pack").content_hash)
                             for s in self.packs()))
        return RunIdentity(rec.name, rec.version, rec.content_hash, packs, _tool_version())

    def record_conformance(self, identity, *, harness_hash: str, started_at: datetime, settings: dict,
                           results: list[dict]) -> int:
        """Store one conformance run and its verdicts, in one transaction; returns the run id."""
        from torchfl.registry.evidence import check_result, write_conformance

        for r in results:  # refuse a bad row before opening the transaction
            check_result(r)
        self.record(identity.chip_name, identity.chip_version)  # the chip must be published
        with self._write() as conn:
            return write_conformance(conn, identity, harness_hash=harness_hash, started_at=started_at,
                                     settings=settings, results=results)

    def record_routes(self, identity, *, model: str, precision: str | None, routes: dict) -> int:
        """Store one model run's route counts ``{op: {route: count}}``; returns the run id."""
        from torchfl.registry.evidence import write_routes

        self.record(identity.chip_name, identity.chip_version)
        with self._write() as conn:
            return write_routes(conn, identity, model=model, precision=precision, routes=routes)

    def evidence(self, *, chip: str | None = None, op: str | None = None) -> list:
        """The latest conformance verdict per (chip, op, dtype, layout), each marked stale when
        its chip version or rule packs are no longer the registry's latest."""
        from torchfl.registry.evidence import mark_stale, read_evidence

        with self._read() as r:
            rows = read_evidence(r, chip=chip, op=op)
        current = {}
        for name in sorted({e.identity.chip_name for e in rows}):
            try:
                ident = self.identity(name)
            except NotFound:
                continue
            current[name] = (ident.chip_version, ident.chip_hash, ident.packs)
        return mark_stale(rows, current)

    def conformance_runs(self, *, chip: str | None = None) -> list[dict]:
        """Every conformance run, newest first, with its verdict counts."""
        from torchfl.registry.evidence import read_runs

        with self._read() as r:
            return read_runs(r, chip=chip)

    def routes(self, chip: str, *, model: str | None = None) -> list[dict]:
        """Recorded model runs' route counts on ``chip``, newest first."""
        from torchfl.registry.evidence import read_routes

        with self._read() as r:
            return read_routes(r, chip=chip, model=model)

    def _not_found(self, r, kind: str, name: str) -> NotFound:
        names = [row[0] for row in r.rows(f"SELECT DISTINCT name FROM {TABLE_NAMES[kind]}")]
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        close += [n for n in names if n.lower() == name.lower() and n not in close]
        hint = f"; did you mean {', '.join(close)}?" if close else (
            f"; known: {', '.join(sorted(names)[:10])}" if names else "; none is published yet: import one first")
        return NotFound(f"no {kind} named {name!r} in {self.display_url}{hint}")

    # ------------------------------------------------------------------ checks

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` (``"ok"``); on PostgreSQL, ``"ok"`` after reading every table."""
        with self._read() as r:
            return r.integrity_check(TABLE_NAMES.values())


def open_registry(registry) -> Registry:
    """``registry`` itself when it is a Registry, else the Registry of that URL (None: the
    default). The one place a layer above turns "a Registry or a URL" into a Registry."""
    return registry if isinstance(registry, Registry) else Registry(registry)
