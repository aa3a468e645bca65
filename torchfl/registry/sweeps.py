"""Sweeps: work fanned out over workers, each unit's result written to the registry exactly once.

A *sweep* (a conformance run over a chip's ops, ``plan compare`` over chips, ...) is split into
*units* with stable keys. The driver records the run and the keys of its units
(:meth:`Sweeps.start`); whichever worker runs a unit writes its result in its own transaction,
keyed by ``(run, unit)`` and inserted with the dialect's ``ON CONFLICT DO NOTHING``
(:meth:`Sweeps.record_unit`): a unit retried after its worker died, or run again by a second
driver, writes nothing twice and gets back the result that was stored first. A run whose
driver died keeps the units that finished and shows as *partial*; resuming it runs only the
missing ones. When every unit is in, the driver finishes the run once (``sweep_finishes`` is
unique per run), in the same transaction as what it produced (:meth:`Sweeps.finish_conformance`
writes the conformance evidence and the finish together, or neither).

Rows are append-only (the database refuses UPDATE and DELETE). This module knows nothing of
how units are executed (local processes, Ray, ...) nor of torch: results are JSON values.
It reaches the registry's transactions through :class:`~torchfl.registry.Registry`'s own
``_read``/``_write`` (one package).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone

from torchfl.registry.errors import NotFound, RegistryError
from torchfl.registry.reader import timestamp

#: what the registry accepts as a sweep's kind (the commands that sweep)
KINDS = ("conformance", "compare", "impact", "bench_zoo", "fidelity")


class SweepRefused(RegistryError):
    """A sweep write that would break its contract (a unit the run does not have, a bad kind)."""

    exit_code = 1


def encode(value) -> str:
    """The stored form of a spec, a result or an outcome: JSON, keys sorted."""
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def spec_hash(spec: dict) -> str:
    return hashlib.sha256(encode(spec).encode()).hexdigest()


@dataclass(frozen=True)
class SweepRun:
    id: int
    kind: str
    label: str
    spec: dict
    spec_hash: str
    units: tuple
    tool_version: str
    driver: str
    created_at: datetime
    done: int = 0
    finished_at: datetime | None = None
    outcome: dict | None = None

    @property
    def status(self) -> str:
        """``finished`` (its outcome is recorded), ``complete`` (every unit in, not finished yet)
        or ``partial`` (units missing: resume it)."""
        if self.finished_at is not None:
            return "finished"
        return "complete" if self.done >= len(self.units) else "partial"

    def as_dict(self) -> dict:
        return dict(run=self.id, kind=self.kind, label=self.label, status=self.status, units=len(self.units),
                    done=self.done, tool_version=self.tool_version, driver=self.driver,
                    created_at=self.created_at.isoformat(),
                    finished_at=self.finished_at.isoformat() if self.finished_at else None,
                    outcome=self.outcome, spec=self.spec)


@dataclass(frozen=True)
class UnitResult:
    """One unit's stored result. ``written``: this call stored it (False: it was there already)."""

    unit: str
    result: object
    node: str
    seconds: float
    finished_at: datetime
    written: bool = False


class Sweeps:
    """The sweep tables of one registry (``Sweeps(Registry(url))``)."""

    def __init__(self, registry):
        self.registry = registry

    # ------------------------------------------------------------------ writes

    def start(self, kind: str, label: str, spec: dict, units, *, driver: str) -> SweepRun:
        """Record a new run of ``units`` (distinct keys); returns it (nothing done yet)."""
        from sqlalchemy import insert

        from torchfl.registry.api import _tool_version
        from torchfl.registry.schema import sweep_runs

        units = tuple(units)
        if kind not in KINDS:
            raise SweepRefused(f"sweep kind {kind!r} is not one of {', '.join(KINDS)}")
        if len(set(units)) != len(units):
            dup = sorted({u for u in units if units.count(u) > 1})
            raise SweepRefused(f"sweep {label!r} names a unit twice ({', '.join(dup[:5])}); unit keys must be unique")
        if any(len(u) > 400 for u in units):
            raise SweepRefused(f"sweep {label!r}: a unit key is longer than 400 characters")
        now = datetime.now(timezone.utc)
        values = dict(kind=kind, label=label[:200], spec=encode(spec), spec_hash=spec_hash(spec),
                      units=encode(list(units)), unit_count=len(units), tool_version=_tool_version(),
                      driver=driver[:200], created_at=now)
        with self.registry._write() as conn:
            run_id = conn.execute(insert(sweep_runs).values(**values).returning(sweep_runs.c.id)).scalar_one()
        return SweepRun(run_id, kind, values["label"], json.loads(values["spec"]), values["spec_hash"], units,
                        values["tool_version"], values["driver"], now)

    def record_unit(self, run_id: int, unit: str, result, *, node: str, seconds: float) -> UnitResult:
        """Store ``unit``'s result once, in its own transaction; a second write of the same
        (run, unit) stores nothing and returns the first one's result (``written`` False)."""
        from sqlalchemy import select

        from torchfl.registry.schema import sweep_runs, sweep_units

        text = encode(result)
        now = datetime.now(timezone.utc)
        with self.registry._write() as conn:
            row = conn.execute(select(sweep_runs.c.units).where(sweep_runs.c.id == run_id)).first()
            if row is None:
                raise NotFound(f"no sweep run {run_id} in {self.registry.display_url}")
            if unit not in json.loads(row[0]):
                raise SweepRefused(f"sweep run {run_id} has no unit {unit!r}: a worker of another run or "
                                   "another torchfl wrote to it; check that every node runs the same torchfl")
            # RETURNING tells whether this insert stored the row (rowcount is -1 on some drivers)
            stmt = self.registry.dialect.insert_ignore(sweep_units, keys=("run_id", "unit")).returning(sweep_units.c.id)
            written = conn.execute(stmt, dict(run_id=run_id, unit=unit, result=text, node=node[:200],
                                              seconds=float(seconds), finished_at=now)).first() is not None
            if written:
                return UnitResult(unit, json.loads(text), node[:200], float(seconds), now, True)
            first = conn.execute(select(sweep_units.c.result, sweep_units.c.node, sweep_units.c.seconds,
                                        sweep_units.c.finished_at)
                                 .where(sweep_units.c.run_id == run_id, sweep_units.c.unit == unit)).one()
        return UnitResult(unit, json.loads(first[0]), first[1], first[2], timestamp(first[3]), False)

    def finish(self, run_id: int, outcome: dict, *, write=None) -> tuple[dict, bool]:
        """Mark the run finished with ``outcome``, once: ``(outcome, True)``; when it was
        finished already, nothing is written (``write`` included) and the stored outcome comes
        back with False. ``write(conn) -> dict`` runs first in the same transaction and its
        result is merged into the outcome (the evidence the run produced)."""
        from torchfl.registry.schema import sweep_finishes

        run = self.get(run_id)
        if run.finished_at is not None:
            return run.outcome, False
        if run.done < len(run.units):
            missing = [u for u in run.units if u not in self.results(run_id)]
            raise SweepRefused(f"sweep run {run_id} lacks {len(missing)} of its {len(run.units)} units "
                               f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); resume it first")

        class _Finished(Exception):
            pass

        try:
            with self.registry._write() as conn:
                full = dict(outcome, **(write(conn) if write is not None else {}))
                stmt = self.registry.dialect.insert_ignore(sweep_finishes, keys=("run_id",)).returning(
                    sweep_finishes.c.id)
                if conn.execute(stmt, dict(run_id=run_id, finished_at=datetime.now(timezone.utc),
                                           outcome=encode(full))).first() is None:
                    raise _Finished   # another driver finished it meanwhile: roll back what write() did
                return json.loads(encode(full)), True
        except _Finished:
            pass
        with self.registry._read() as r:
            row = r.first("SELECT outcome FROM sweep_finishes WHERE run_id = ?", (run_id,))
        return json.loads(row[0]), False

    def finish_conformance(self, run_id: int, identity, *, harness_hash: str, started_at: datetime,
                           settings: dict, results: list[dict]) -> tuple[int, bool]:
        """Finish a conformance sweep: its evidence run and the finish in one transaction.
        ``(conformance run id, written)``; finished before: that run's id, False."""
        from torchfl.registry.evidence import check_result, write_conformance

        for r in results:
            check_result(r)

        def write(conn) -> dict:
            return {"conformance_run": write_conformance(conn, identity, harness_hash=harness_hash,
                                                         started_at=started_at, settings=settings,
                                                         results=results)}

        outcome, written = self.finish(run_id, {}, write=write)
        return int(outcome["conformance_run"]), written

    # ------------------------------------------------------------------ reads

    _RUN_SQL = ("SELECT s.id, s.kind, s.label, s.spec, s.spec_hash, s.units, s.tool_version, s.driver, s.created_at, "
                "(SELECT count(*) FROM sweep_units u WHERE u.run_id = s.id), f.finished_at, f.outcome "
                "FROM sweep_runs s LEFT JOIN sweep_finishes f ON f.run_id = s.id")

    @staticmethod
    def _run(row) -> SweepRun:
        return SweepRun(row[0], row[1], row[2], json.loads(row[3]), row[4], tuple(json.loads(row[5])), row[6], row[7],
                        timestamp(row[8]), int(row[9]), timestamp(row[10]) if row[10] is not None else None,
                        json.loads(row[11]) if row[11] is not None else None)

    def get(self, run_id: int) -> SweepRun:
        with self.registry._read() as r:
            row = r.first(self._RUN_SQL + " WHERE s.id = ?", (int(run_id),))
        if row is None:
            raise NotFound(f"no sweep run {run_id} in {self.registry.display_url}; "
                           "`torchfl conformance --sweeps` lists them")
        return self._run(row)

    def runs(self, *, kind: str | None = None) -> list[SweepRun]:
        """Every sweep run, newest first."""
        with self.registry._read() as r:
            rows = r.rows(self._RUN_SQL + (" WHERE s.kind = ?" if kind else "") + " ORDER BY s.id DESC",
                          (kind,) if kind else ())
        return [self._run(row) for row in rows]

    def results(self, run_id: int) -> dict[str, UnitResult]:
        """The stored results of a run's units, by unit key."""
        with self.registry._read() as r:
            rows = r.rows("SELECT unit, result, node, seconds, finished_at FROM sweep_units WHERE run_id = ? "
                          "ORDER BY id", (int(run_id),))
        return {row[0]: UnitResult(row[0], json.loads(row[1]), row[2], float(row[3]), timestamp(row[4]))
                for row in rows}

    def result(self, run_id: int, unit: str) -> UnitResult | None:
        """One unit's stored result, None when it has none yet."""
        with self.registry._read() as r:
            row = r.first("SELECT unit, result, node, seconds, finished_at FROM sweep_units "
                          "WHERE run_id = ? AND unit = ?", (int(run_id), unit))
        return None if row is None else UnitResult(row[0], json.loads(row[1]), row[2], float(row[3]),
                                                   timestamp(row[4]))
