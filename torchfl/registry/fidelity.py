"""Fidelity evidence: how well a chip's predicted times matched published measurements.

One **fidelity run** (``torchfl fidelity --record``) scores one chip version against the rows
of one or more tables: per row the measured and the predicted per-call time (NULL where the
row could not be planned, with the reason). Like conformance evidence (``evidence.py``) the
rows are append-only (the database refuses UPDATE, DELETE and, on PostgreSQL, TRUNCATE) and
tied to the chip's content hash, the rule packs and the torchfl version; a newer run of the
same chip supersedes an older one, and a run whose chip hash is no longer the published
latest is *stale* (its predictions were made with other numbers).

No torch: rows are plain dicts; the caller (``torchfl.fidelity``) makes them. The functions
take a :class:`~torchfl.registry.api.Registry` and use its one write transaction and its
driver-level reads.
"""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone

from torchfl.registry.reader import timestamp

__all__ = ["ROW_KEYS", "check_row", "record_fidelity", "fidelity_runs", "fidelity_summary", "checked_line"]

ROW_KEYS = ("table_name", "line", "op", "family", "shapes", "dtype", "args", "source", "measured_s",
            "predicted_s", "reason", "in_sample")


# The plausible time of one call, as torchfl.fidelity.tables' MIN_SECONDS..MAX_SECONDS (the
# registry layer does not import fidelity; a test checks both agree): 5e-324 s passed the old
# "positive" check and made every error it entered infinite.
MEASURED_S_RANGE = (1e-9, 86_400.0)


def check_row(row: dict) -> dict:
    """A row as stored, or ValueError naming the bad field (the scorer's contract)."""
    missing = [k for k in ROW_KEYS if k not in row and k not in ("predicted_s", "reason", "in_sample")]
    if missing:
        raise ValueError(f"fidelity row {row.get('table_name', '?')}:{row.get('line', '?')} lacks "
                         f"{', '.join(missing)}")
    out = {k: row.get(k) for k in ROW_KEYS}
    measured = float(out["measured_s"])
    low, high = MEASURED_S_RANGE
    if not low <= measured <= high:                  # NaN fails both comparisons
        raise ValueError(f"fidelity row {out['table_name']}:{out['line']}: measured_s must be a positive time "
                         f"of one call, {low:g} to {high:g} s, got {out['measured_s']!r}; check the unit (seconds)")
    predicted = out["predicted_s"]
    if predicted is not None and not (math.isfinite(float(predicted)) and float(predicted) >= 0):
        raise ValueError(f"fidelity row {out['table_name']}:{out['line']}: predicted_s must be a time >= 0 or "
                         f"None, got {predicted!r}")
    out.update(line=int(out["line"]), measured_s=measured,
               predicted_s=None if predicted is None else float(predicted),
               shapes=out["shapes"] if isinstance(out["shapes"], str) else json.dumps(out["shapes"]),
               args=out["args"] if isinstance(out["args"], str) else json.dumps(out["args"], sort_keys=True),
               in_sample=bool(out["in_sample"]))
    return out


def record_fidelity(registry, identity, *, tables: list, rows: list[dict]) -> int:
    """Store one run (``identity`` from ``registry.identity(chip)``; ``tables``: ``[[file
    name, sha256], ...]``) and its rows in one transaction; returns the run id. The chip
    version must be published in ``registry``."""
    from sqlalchemy import insert

    from torchfl.registry.schema import fidelity_rows, fidelity_runs as runs_table

    checked = [check_row(r) for r in rows]       # a bad row refuses the run before any write
    registry.record(identity.chip_name, identity.chip_version)
    with registry._write() as conn:
        run_id = conn.execute(insert(runs_table).values(
            chip_name=identity.chip_name, chip_version=identity.chip_version, chip_hash=identity.chip_hash,
            packs=json.dumps([list(p) for p in identity.packs]), tool_version=identity.tool_version,
            recorded_at=datetime.now(timezone.utc), tables=json.dumps([list(t) for t in tables]),
        ).returning(runs_table.c.id)).scalar_one()
        if checked:
            conn.execute(insert(fidelity_rows), [dict(r, run_id=run_id) for r in checked])
    return run_id


def fidelity_runs(registry, *, chip: str | None = None) -> list[dict]:
    """Every fidelity run (newest first) with its counts and mean absolute error over the
    planned rows (all, and out-of-sample only)."""
    sql = ("SELECT id, chip_name, chip_version, chip_hash, tool_version, recorded_at, tables FROM fidelity_runs"
           + (" WHERE chip_name = ?" if chip else "") + " ORDER BY id DESC")
    out = []
    with registry._read() as r:
        for row in r.rows(sql, (chip,) if chip else ()):
            stats = _stats(r.rows("SELECT measured_s, predicted_s, in_sample FROM fidelity_rows WHERE run_id = ?",
                                  (row[0],)))
            out.append(dict(run=row[0], chip=row[1], chip_version=row[2], chip_hash=row[3], tool_version=row[4],
                            recorded_at=timestamp(row[5]).isoformat(), tables=json.loads(row[6]), **stats))
    return out


def _stats(rows) -> dict:
    """Counts and mean errors of a run's rows; ``planned`` counts the rows with a prediction and
    a finite error (a row recorded before measured_s was bounded, such as 5e-324 s, has an
    infinite one: averaged, it made every mean ``inf``; it is left out of the means)."""
    planned = [(m, p, bool(s)) for m, p, s in rows
               if p is not None and m and math.isfinite(abs(p - m) / m)]
    errs = [abs(p - m) / m for m, p, _ in planned]
    held = [abs(p - m) / m for m, p, s in planned if not s]
    return dict(rows=len(rows), planned=len(planned), mean_abs_error=sum(errs) / len(errs) if errs else None,
                out_of_sample=len(held), out_of_sample_mean_abs_error=sum(held) / len(held) if held else None)


def fidelity_summary(registry, chip: str) -> dict:
    """What the latest run says about ``chip``'s published version: ``state`` is ``checked``,
    ``stale`` (the run predicted with another version's numbers) or ``unchecked``."""
    runs = fidelity_runs(registry, chip=chip)
    if not runs:
        return {"chip": chip, "state": "unchecked"}
    latest = runs[0]
    current = registry.record(chip)
    state = "checked" if latest["chip_hash"] == current.content_hash else "stale"
    out = {"chip": chip, "state": state, **latest}
    if state == "stale":
        out["stale"] = f"run {latest['run']} scored {chip} {latest['chip_version']}, now {current.version}"
    return out


def checked_line(summary: dict) -> str:
    """One line for ``plan explain``, quoting the out-of-sample figure: ``A100-SXM4-80GB:
    predictions checked on 84 published measurements, mean error 12% (run 3, 2026-12-06)``;
    rows a chip number was fitted on are named apart and never counted as a check."""
    chip = summary["chip"]
    if summary["state"] == "unchecked" or not summary.get("planned"):
        return (f"{chip}: predictions unchecked (no fidelity run: `torchfl fidelity --table FILE --chip {chip} "
                "--record` scores them against measured times)")
    held = summary["planned"] - summary["out_of_sample"]
    if not summary["out_of_sample"]:
        text = (f"{chip}: predictions checked in-sample only: {held} published measurements a chip number was "
                f"fitted on, mean error {summary['mean_abs_error']:.0%}; no out-of-sample check")
    else:
        text = (f"{chip}: predictions checked on {summary['out_of_sample']} published measurements, mean error "
                f"{summary['out_of_sample_mean_abs_error']:.0%}")
        if held:
            text += f" out of sample ({held} in-sample row{'s' if held != 1 else ''} not counted)"
    text += f" (run {summary['run']}, {summary['recorded_at'][:10]})"
    if summary["state"] == "stale":
        text += f"; stale: {summary['stale']}"
    return text
