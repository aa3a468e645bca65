"""The registry side of sweeps, on SQLite and on a real PostgreSQL: each (run, unit) is written
once whoever writes it and however often, a run is finished once (its evidence with it), a run
whose driver stopped is partial, and the rows refuse UPDATE/DELETE in the database itself."""

from __future__ import annotations

import threading

import pytest

from torchfl.registry import NotFound, Registry
from torchfl.registry.sweeps import SweepRefused, Sweeps


@pytest.fixture
def reg(registry_url):
    r = Registry(registry_url)
    r.init(seed=True)
    yield r
    r.close()


def test_a_unit_written_twice_is_stored_once_and_the_second_writer_gets_the_first_result(reg):
    s = Sweeps(reg)
    run = s.start("compare", "m on 2 chips", {"model": "m"}, ["A", "B"], driver="here")
    first = s.record_unit(run.id, "A", {"t": 1.5}, node="n1 pid 1", seconds=2.0)
    again = s.record_unit(run.id, "A", {"t": 9.9}, node="n2 pid 2", seconds=3.0)   # a retried task
    assert first.written and not again.written
    assert again.result == {"t": 1.5} and again.node == "n1 pid 1"
    assert list(s.results(run.id)) == ["A"] and s.get(run.id).status == "partial"
    with pytest.raises(SweepRefused, match="has no unit 'C'"):
        s.record_unit(run.id, "C", 1, node="n", seconds=0.1)
    with pytest.raises(NotFound, match="no sweep run 999"):
        s.record_unit(999, "A", 1, node="n", seconds=0.1)
    with pytest.raises(SweepRefused, match="lacks 1 of its 2 units"):
        s.finish(run.id, {})
    s.record_unit(run.id, "B", [1, None, "x"], node="n2 pid 2", seconds=1.0)
    assert s.get(run.id).status == "complete"
    out, written = s.finish(run.id, {"rows": 2})
    out2, written2 = s.finish(run.id, {"rows": 99})
    assert (out, written, out2, written2) == ({"rows": 2}, True, {"rows": 2}, False)
    got = s.get(run.id)
    assert got.status == "finished" and got.outcome == {"rows": 2} and got.done == 2
    assert [r.id for r in s.runs(kind="compare")] == [run.id] and s.runs(kind="impact") == []


def test_concurrent_writers_of_one_unit_store_one_row(reg):
    """Eight threads, each with its own Registry (its own connections), write the same unit at once."""
    s = Sweeps(reg)
    run = s.start("conformance", "race", {}, ["u"], driver="here")
    results, errors = [], []
    barrier = threading.Barrier(8)

    def write(i):
        try:
            with Registry(reg.url) as mine:
                barrier.wait()
                results.append(Sweeps(mine).record_unit(run.id, "u", {"by": i}, node=f"w{i}", seconds=0.0))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(r.written for r in results) == 1
    winner = next(r for r in results if r.written)
    assert all(r.result == winner.result for r in results)
    with reg._read() as r:
        assert r.first("SELECT count(*) FROM sweep_units WHERE run_id = ?", (run.id,))[0] == 1


def test_finishing_a_conformance_sweep_writes_its_evidence_once(reg):
    s = Sweeps(reg)
    ident = reg.identity("NPU-V3")
    run = s.start("conformance", "conformance NPU-V3", {"chip": "NPU-V3"}, ["neg float16"], driver="here")
    s.record_unit(run.id, "neg float16", [], node="n", seconds=0.1)
    row = dict(op="aten.neg.default", dtype="float16", layout="contiguous", verdict="pass", samples=2, passed=2,
               failed=0, refused=0, max_abs_error=0.0, max_rel_error=0.0, reason=None, first_failure=None)
    from datetime import datetime, timezone

    kw = dict(harness_hash="h" * 64, started_at=datetime.now(timezone.utc), settings={}, results=[row])
    cid, written = s.finish_conformance(run.id, ident, **kw)
    cid2, written2 = s.finish_conformance(run.id, ident, **kw)
    assert written and not written2 and cid == cid2
    assert [r["run"] for r in reg.conformance_runs(chip="NPU-V3")] == [cid]
    assert s.get(run.id).outcome == {"conformance_run": cid}


@pytest.mark.parametrize("table", ["sweep_runs", "sweep_units", "sweep_finishes"])
def test_sweep_rows_cannot_be_edited_even_by_sql(reg, table):
    s = Sweeps(reg)
    run = s.start("compare", "x", {}, ["u"], driver="here")
    s.record_unit(run.id, "u", 1, node="n", seconds=0.0)
    s.finish(run.id, {})
    from sqlalchemy import text

    for statement in (f"UPDATE {table} SET id = id", f"DELETE FROM {table}"):
        with pytest.raises(Exception, match="immutable"):
            with reg._write() as conn:
                conn.execute(text(statement))
    assert s.get(run.id).status == "finished"


def test_a_sweep_refuses_duplicate_keys_and_unknown_kinds(reg):
    s = Sweeps(reg)
    with pytest.raises(SweepRefused, match="names a unit twice"):
        s.start("compare", "x", {}, ["a", "a"], driver="here")
    with pytest.raises(SweepRefused, match="kind 'nope'"):
        s.start("nope", "x", {}, ["a"], driver="here")
