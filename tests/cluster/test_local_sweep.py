"""Sweeps on local workers: the same execute path as a cluster's, recorded once per unit,
resumable after the driver stopped, and refused by a worker that is not the driver's torchfl."""

from __future__ import annotations

import dataclasses

import pytest

from torchfl.cluster.fingerprint import Fingerprint, VersionMismatch, local
from torchfl.cluster.local import LocalRunner
from torchfl.cluster.sweep import ResumeRefused, Sweep
from torchfl.cluster.units import Job, Unit, execute
from torchfl.registry import Registry
from torchfl.registry.sweeps import Sweeps

SQUARE = "tests.cluster.work:square"


@pytest.fixture
def reg(tmp_path):
    r = Registry(f"sqlite:///{tmp_path / 'r.db'}")
    r.init()
    yield r
    r.close()


def _units(n):
    return [Unit(f"x={i}", SQUARE, (i,)) for i in range(n)]


def test_a_stopped_sweep_is_partial_and_resume_runs_only_the_missing_units(reg):
    sweep = Sweep(LocalRunner(1), "compare", "squares", {"n": 5}, _units(5), registry=reg)
    it = sweep.run()
    firsts = [next(it), next(it)]          # the driver stops after two units (no finish)
    it.close()
    assert [d.unit for d in firsts] == ["x=0", "x=1"] and all(d.written for d in firsts)
    run = Sweeps(reg).get(sweep.run_id)
    assert run.status == "partial" and run.done == 2
    assert "2 of 5 units recorded; finish it with --resume" in sweep.partial_note()
    again = Sweep(LocalRunner(2), "compare", "squares", {"n": 5}, _units(5), registry=reg, resume=run.id)
    done = list(again.run())
    assert sorted(d.unit for d in done) == [f"x={i}" for i in range(5)]
    assert [d.unit for d in done if d.resumed] == ["x=0", "x=1"]
    assert all(d.written for d in done if not d.resumed)
    assert {d.unit: d.result for d in done} == {f"x={i}": {"x": i, "square": i * i} for i in range(5)}
    assert again.finish({"ok": True}) == ({"ok": True}, True)
    assert Sweeps(reg).get(run.id).status == "finished"


def test_resume_refuses_another_sweep_by_what_differs(reg):
    sweep = Sweep(LocalRunner(1), "compare", "squares", {"n": 3, "chip": "A"}, _units(3), registry=reg)
    next(sweep.run())
    with pytest.raises(ResumeRefused, match=r'chip: run "A", now "B"'):
        Sweep(LocalRunner(1), "compare", "squares", {"n": 3, "chip": "B"}, _units(3), registry=reg,
              resume=sweep.run_id).open()
    with pytest.raises(ResumeRefused, match="is a compare sweep"):
        Sweep(LocalRunner(1), "impact", "squares", {"n": 3, "chip": "A"}, _units(3), registry=reg,
              resume=sweep.run_id).open()
    with pytest.raises(ResumeRefused, match="other units"):
        Sweep(LocalRunner(1), "compare", "squares", {"n": 3, "chip": "A"}, _units(4), registry=reg,
              resume=sweep.run_id).open()


def test_a_retried_unit_returns_the_stored_result_without_running_again(reg):
    """What a Ray retry does after its worker wrote and died: the second execute finds the row."""
    s = Sweeps(reg)
    run = s.start("compare", "pids", {}, ["p"], driver="here")
    job = Job(local(), reg.url, run.id, threads=None)
    first = execute(Unit("p", "tests.cluster.work:pid_of", (0,)), job)
    second = execute(Unit("p", "tests.cluster.work:square", (7,)), job)   # would compute something else
    assert first.written and not second.written and second.result == first.result
    assert len(s.results(run.id)) == 1


def test_a_worker_that_is_not_the_drivers_torchfl_refuses_by_name(reg):
    mine = local()
    other = dataclasses.replace(mine, torchfl="0.0.9", packs=mine.packs[:-1] + ((mine.packs[-1][0], "0" * 64),))
    with pytest.raises(VersionMismatch) as err:
        execute(Unit("u", SQUARE, (1,)), Job(other, None, None, threads=None))
    text = str(err.value)
    assert f"torchfl {mine.torchfl}, the driver 0.0.9" in text
    assert f"rule pack {mine.packs[-1][0]} sha256:{mine.packs[-1][1][:12]}, the driver sha256:000000000000" in text
    assert "install the driver's torchfl" in text and "\n" not in text
    sources = dataclasses.replace(mine, source="f" * 64)
    assert mine.differences(sources) == [f"torchfl {mine.torchfl} from other sources (sha256:{mine.source[:12]}, "
                                         "the driver sha256:ffffffffffff)"]
    assert isinstance(mine, Fingerprint) and mine.differences(mine) == []


def test_spawned_workers_write_each_unit_once(reg):
    sweep = Sweep(LocalRunner(2), "compare", "squares", {"n": 4}, _units(4), registry=reg)
    done = list(sweep.run())
    assert sorted(d.unit for d in done) == [f"x={i}" for i in range(4)] and all(d.written for d in done)
    nodes = {d.node for d in Sweeps(reg).results(sweep.run_id).values()}
    assert 1 <= len(nodes) <= 2 and all(" pid " in n for n in nodes)
