"""Concurrent writers in separate processes: nothing lost, nothing duplicated, no errors."""

from __future__ import annotations

import multiprocessing as mp
import traceback

from tests.registry.registry_gen import hcd_text, many

from torchfl.registry.names import HEAD
from torchfl.registry import Registry

PROCS = 8
PER_PROC = 50


def _worker(url: str, items, barrier, results) -> None:
    try:
        statuses = []
        with Registry(url) as r:
            r.schema_revision()  # connect before the start line, so the race is in the writes
            barrier.wait(timeout=120)
            for item in items:  # one transaction per chip: 50 commits racing 7 other processes
                statuses += [o.status for o in r.import_texts([item]).outcomes]
        results.put(("ok", statuses))
    except BaseException:
        results.put(("error", traceback.format_exc()))


def _run(url: str, batches) -> list:
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(len(batches)), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, b, barrier, results)) for b in batches]
    for p in procs:
        p.start()
    out = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    errors = [detail for kind, detail in out if kind == "error"]
    assert not errors, errors[0]
    return [s for _, statuses in out for s in statuses]


def test_eight_processes_fifty_distinct_chips_each(registry_url):
    with Registry(registry_url) as r:
        r.init()
    batches = [many(f"P{p}", PER_PROC) for p in range(PROCS)]
    statuses = _run(registry_url, batches)
    assert statuses.count("added") == PROCS * PER_PROC
    with Registry(registry_url) as r:
        chips = r.chips()
        assert len(chips) == PROCS * PER_PROC
        assert all(c.versions == ("1.0.0",) for c in chips)
        assert r.integrity_check() == "ok"
        if r.backend == "sqlite":
            import sqlite3

            from torchfl.registry.dialects.sqlite import sqlite_file

            conn = sqlite3.connect(sqlite_file(registry_url))
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert conn.execute("SELECT count(*), count(DISTINCT name) FROM chip_versions").fetchone() == (400, 400)
            conn.close()


def test_eight_processes_same_chip_one_row(registry_url):
    with Registry(registry_url) as r:
        r.init()
    same = [("same.hcd", hcd_text("SAME-1"))]
    statuses = _run(registry_url, [same] * PROCS)
    assert sorted(statuses) == ["added"] + ["unchanged"] * (PROCS - 1)
    with Registry(registry_url) as r:
        assert [(c.name, c.versions) for c in r.chips()] == [("SAME-1", ("1.0.0",))]
        assert len(r.history("SAME-1")) == 1
        assert r.integrity_check() == "ok"


def _init_worker(url: str, barrier, results) -> None:
    try:
        r = Registry(url)
        barrier.wait(timeout=120)
        results.put(("ok", [r.init()["from"]]))
    except BaseException:
        results.put(("error", traceback.format_exc()))


def test_concurrent_init_of_a_fresh_registry(registry_url):
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_init_worker, args=(registry_url, barrier, results)) for _ in range(4)]
    for p in procs:
        p.start()
    out = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [k for k, _ in out] == ["ok"] * 4, [d for k, d in out if k == "error"][:1]
    assert sorted(str(v[0]) for _, v in out) == [HEAD, HEAD, HEAD, "None"]
    assert Registry(registry_url).schema_revision() == HEAD
