"""Evidence: what executions showed about a chip's claimed support, kept beside the claims.

Two kinds of rows, both append-only (the database refuses UPDATE and DELETE):

- a **conformance run** (``torchfl conformance``) and its verdict per (ATen overload,
  dtype, layout): ``pass`` / ``partial`` / ``fail`` / ``refused``, sample counts, the
  largest error, the reason of a refusal and the first failing sample;
- a **route run** (``plan explain --analyze --record``): how many nodes of each ATen op
  ran on which kernel, were folded, or fell back, in one model run.

Each run is tied to the chip version's content hash, the rule packs' versions and
hashes, the torchfl version (and, for conformance, the harness's hash). Nothing is ever
edited: a newer run of the same (chip, op, dtype, layout) supersedes an older one, and a
verdict whose chip or packs no longer match the registry's latest is *stale*.

This module knows nothing of torch: rows are plain dicts. Writes go through SQLAlchemy in
one transaction; reads are plain SQL on the driver (see ``reader.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone

from torchfl.registry.reader import timestamp

VERDICTS = ("pass", "partial", "fail", "refused")
#: per claim, what the latest evidence says (the order is also the display order)
STATES = ("verified", "partial", "failing", "refused", "stale", "unverified")

_RESULT_KEYS = ("op", "dtype", "layout", "verdict", "samples", "passed", "failed", "refused",
                "max_abs_error", "max_rel_error", "reason", "first_failure")


@dataclass(frozen=True)
class RunIdentity:
    """What a run was made against; two runs with equal identities tested the same thing."""

    chip_name: str
    chip_version: str
    chip_hash: str
    packs: tuple  # ((name, version, content_hash), ...), sorted
    tool_version: str

    def as_dict(self) -> dict:
        return dict(chip_name=self.chip_name, chip_version=self.chip_version, chip_hash=self.chip_hash,
                    packs=[list(p) for p in self.packs], tool_version=self.tool_version)


@dataclass(frozen=True)
class Evidence:
    """One stored verdict with the run it came from."""

    run_id: int
    finished_at: datetime
    identity: RunIdentity
    harness_hash: str
    op: str
    dtype: str
    layout: str
    verdict: str
    samples: int
    passed: int
    failed: int
    refused: int
    max_abs_error: float | None
    max_rel_error: float | None
    reason: str | None
    first_failure: dict | None = None
    stale: tuple = field(default=())  # why it no longer describes the chip as published (empty: current)

    def as_dict(self) -> dict:
        return dict(run=self.run_id, finished_at=self.finished_at.isoformat(), op=self.op, dtype=self.dtype,
                    layout=self.layout, verdict=self.verdict, samples=self.samples, passed=self.passed,
                    failed=self.failed, refused=self.refused, max_abs_error=self.max_abs_error,
                    max_rel_error=self.max_rel_error, reason=self.reason, first_failure=self.first_failure,
                    chip_version=self.identity.chip_version, chip_hash=self.identity.chip_hash,
                    packs=[list(p) for p in self.identity.packs], tool_version=self.identity.tool_version,
                    harness_hash=self.harness_hash, stale=list(self.stale))


def check_result(row: dict) -> dict:
    """A result row as stored, or ValueError naming the bad field (the harness's contract)."""
    missing = [k for k in ("op", "dtype", "layout", "verdict", "samples", "passed", "failed", "refused")
               if k not in row]
    if missing:
        raise ValueError(f"evidence row for {row.get('op', '?')} lacks {', '.join(missing)}")
    if row["verdict"] not in VERDICTS:
        raise ValueError(f"evidence row for {row['op']}: verdict {row['verdict']!r} is not one of {VERDICTS}")
    out = {k: row.get(k) for k in _RESULT_KEYS}
    for k in ("samples", "passed", "failed", "refused"):
        out[k] = int(out[k])
    ff = out["first_failure"]
    out["first_failure"] = None if ff is None else json.dumps(ff, sort_keys=True, default=str)
    return out


# ---------------------------------------------------------------- writes (SQLAlchemy, caller's transaction)

def write_conformance(conn, identity: RunIdentity, *, harness_hash: str, started_at: datetime,
                      settings: dict, results: list[dict]) -> int:
    """Insert one run and all its results; returns the run id."""
    from sqlalchemy import insert

    from torchfl.registry.schema import conformance_results, conformance_runs

    rows = [check_result(r) for r in results]
    run_id = conn.execute(insert(conformance_runs).values(
        **_identity_values(identity), harness_hash=harness_hash, started_at=started_at,
        finished_at=datetime.now(timezone.utc), settings=json.dumps(settings, sort_keys=True),
    ).returning(conformance_runs.c.id)).scalar_one()
    if rows:
        conn.execute(insert(conformance_results), [dict(r, run_id=run_id) for r in rows])
    return run_id


def write_routes(conn, identity: RunIdentity, *, model: str, precision: str | None, routes: dict) -> int:
    """Insert one model run's route counts ``{op: {route: count}}``; returns the run id."""
    from sqlalchemy import insert

    from torchfl.registry.schema import route_counts, route_runs

    run_id = conn.execute(insert(route_runs).values(
        **_identity_values(identity), recorded_at=datetime.now(timezone.utc), model=model[:200],
        precision=precision).returning(route_runs.c.id)).scalar_one()
    rows = [dict(run_id=run_id, op=op, route=route, count=int(n))
            for op, counts in sorted(routes.items()) for route, n in sorted(counts.items())]
    if rows:
        conn.execute(insert(route_counts), rows)
    return run_id


def _identity_values(identity: RunIdentity) -> dict:
    return dict(chip_name=identity.chip_name, chip_version=identity.chip_version, chip_hash=identity.chip_hash,
                packs=json.dumps([list(p) for p in identity.packs]), tool_version=identity.tool_version)


# ---------------------------------------------------------------- reads (plain SQL)

_EVIDENCE_SQL = (
    "SELECT r.run_id, u.finished_at, u.chip_name, u.chip_version, u.chip_hash, u.packs, u.tool_version, "
    "u.harness_hash, r.op, r.dtype, r.layout, r.verdict, r.samples, r.passed, r.failed, r.refused, "
    "r.max_abs_error, r.max_rel_error, r.reason, r.first_failure "
    "FROM conformance_results r JOIN conformance_runs u ON u.id = r.run_id")


def read_evidence(reader, *, chip: str | None = None, op: str | None = None) -> list[Evidence]:
    """The latest verdict per (chip, op, dtype, layout) (newer runs supersede older ones)."""
    where, params = [], []
    if chip is not None:
        where.append("u.chip_name = ?")
        params.append(chip)
    if op is not None:
        where.append("r.op = ?")
        params.append(op)
    sql = _EVIDENCE_SQL + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.run_id DESC, r.id"
    latest: dict[tuple, Evidence] = {}
    for row in reader.rows(sql, tuple(params)):
        key = (row[2], row[8], row[9], row[10])
        if key in latest:
            continue
        ident = RunIdentity(row[2], row[3], row[4], tuple(tuple(p) for p in json.loads(row[5])), row[6])
        latest[key] = Evidence(row[0], timestamp(row[1]), ident, row[7], row[8], row[9], row[10], row[11],
                               row[12], row[13], row[14], row[15], row[16], row[17], row[18],
                               json.loads(row[19]) if row[19] else None)
    return sorted(latest.values(), key=lambda e: (e.identity.chip_name, e.op, e.dtype, e.layout))


def read_runs(reader, *, chip: str | None = None) -> list[dict]:
    """Every conformance run (newest first) with its verdict counts."""
    sql = ("SELECT u.id, u.chip_name, u.chip_version, u.chip_hash, u.packs, u.tool_version, u.harness_hash, "
           "u.started_at, u.finished_at, u.settings FROM conformance_runs u"
           + (" WHERE u.chip_name = ?" if chip else "") + " ORDER BY u.id DESC")
    runs = []
    for row in reader.rows(sql, (chip,) if chip else ()):
        counts = dict(reader.rows("SELECT verdict, count(*) FROM conformance_results WHERE run_id = ? "
                                  "GROUP BY verdict", (row[0],)))
        runs.append(dict(run=row[0], chip=row[1], chip_version=row[2], chip_hash=row[3],
                         packs=json.loads(row[4]), tool_version=row[5], harness_hash=row[6],
                         started_at=timestamp(row[7]).isoformat(), finished_at=timestamp(row[8]).isoformat(),
                         settings=json.loads(row[9]), verdicts={v: int(counts.get(v, 0)) for v in VERDICTS}))
    return runs


def read_routes(reader, *, chip: str, model: str | None = None) -> list[dict]:
    """Recorded route runs of ``chip`` (newest first), each with ``routes: {op: {route: count}}``."""
    sql = ("SELECT id, chip_name, chip_version, chip_hash, packs, tool_version, recorded_at, model, precision "
           "FROM route_runs WHERE chip_name = ?" + (" AND model = ?" if model else "") + " ORDER BY id DESC")
    out = []
    for row in reader.rows(sql, (chip, model) if model else (chip,)):
        routes: dict = {}
        for op, route, n in reader.rows("SELECT op, route, count FROM route_counts WHERE run_id = ? "
                                        "ORDER BY op, route", (row[0],)):
            routes.setdefault(op, {})[route] = int(n)
        out.append(dict(run=row[0], chip=row[1], chip_version=row[2], chip_hash=row[3], packs=json.loads(row[4]),
                        tool_version=row[5], recorded_at=timestamp(row[6]).isoformat(), model=row[7],
                        precision=row[8], routes=routes))
    return out


# ---------------------------------------------------------------- staleness and claims

def mark_stale(evidence: list[Evidence], current: dict) -> list[Evidence]:
    """Set ``stale`` on each verdict whose chip or packs differ from ``current``.

    ``current``: chip name -> ``(version, content_hash, packs)`` as published now, packs a
    tuple of ``(name, version, content_hash)``."""
    from dataclasses import replace

    out = []
    for e in evidence:
        now = current.get(e.identity.chip_name)
        why = []
        if now is not None:
            version, digest, packs = now
            if e.identity.chip_hash != digest:
                why.append(f"chip {e.identity.chip_name} was {e.identity.chip_version}, now {version}")
            old = {p[0]: tuple(p[1:]) for p in e.identity.packs}
            new = {p[0]: tuple(p[1:]) for p in packs}
            for name in sorted(set(old) | set(new)):
                if old.get(name) != new.get(name):
                    was = old[name][0] if name in old else "absent"
                    is_ = new[name][0] if name in new else "absent"
                    why.append(f"rule pack {name} was {was}, now {is_}")
        out.append(replace(e, stale=tuple(why)))
    return out


def claim_state(evidence: list[Evidence]) -> str:
    """One word for the verdicts of one claim (an op, or an op in one dtype) on one chip."""
    if not evidence:
        return "unverified"
    if any(e.stale for e in evidence):
        return "stale"
    verdicts = {e.verdict for e in evidence}
    if verdicts == {"pass"}:
        return "verified"
    if "fail" in verdicts and not verdicts & {"pass", "partial"}:
        return "failing"
    if verdicts == {"refused"}:
        return "refused"
    return "partial"


def describe(evidence: list[Evidence]) -> dict:
    """A claim's evidence as shown by ``registry ops|support|why-not``: state, when, by which run, how."""
    state = claim_state(evidence)
    out: dict = {"state": state}
    if not evidence:
        return out
    newest = max(evidence, key=lambda e: e.run_id)
    out.update(run=newest.run_id, finished_at=newest.finished_at.isoformat(),
               samples=sum(e.samples for e in evidence), passed=sum(e.passed for e in evidence),
               failed=sum(e.failed for e in evidence), refused=sum(e.refused for e in evidence))
    stale = sorted({w for e in evidence for w in e.stale})
    if stale:
        out["stale"] = stale
    bad = [e for e in evidence if e.verdict != "pass"]
    if bad:
        out["problems"] = [dict(dtype=e.dtype, layout=e.layout, verdict=e.verdict, failed=e.failed,
                                refused=e.refused, samples=e.samples, max_abs_error=e.max_abs_error,
                                reason=e.reason) for e in bad]
    return out


def short(desc: dict, brief: bool = False) -> str:
    """``verified (run 3, 2026-12-04, 40/40 samples pass)`` and the like, for text output;
    ``brief``: ``verified 40/40`` (a table cell)."""
    state = desc["state"]
    if state == "unverified":
        return "unverified"
    if brief:
        return state if state == "stale" else f"{state} {desc['passed']}/{desc['samples']}"
    day = desc["finished_at"][:10]
    text = f"{state} (run {desc['run']}, {day}, {desc['passed']}/{desc['samples']} samples pass"
    if desc.get("refused"):
        text += f", {desc['refused']} refused"
    text += ")"
    if state == "stale":
        text += ": " + "; ".join(desc["stale"])
    return text
