"""``torchfl conformance`` over several chips in one run: what a chip does not change, once.

A chip's run (``harness.run``) draws each OpInfo's samples, runs them in eager torch, traces
and captures each batch of them, then plans and runs the capture on the chip. Only the last
part depends on the chip: here one :class:`CrossUnit` per (OpInfo, dtype) carries every chip
that claims an overload of it (with its own targets), so the samples, eager torch's answers,
Dynamo's trace and the planner's capture are made once for all of them
(``execute.run_cases_on``), in one pool of worker processes for the whole run (one start,
one import of torch and op_db per worker, kernels compiled or loaded once per worker).
Eager-mode units (``--mode eager``) stay one chip each. Each chip still gets its own
:class:`~torchfl.conformance.harness.Report`, aggregated and recorded exactly as alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from torchfl.conformance.harness import (Report, Settings, Unit, _worker_init_light, aggregate, claims,
                                         harness_hash, plan_units, run_unit, run_work)


#: cases of one (OpInfo, dtype) a worker takes at most at a time: max_pool2d's 1,448 cases in
#: float16 were one task of a third of the whole run, which one worker ran while the other
#: idled at the end; a multiple of ``execute.JOINT_MAX``, so a slice makes the same joint graphs
CHUNK = 4 * 48


@dataclass
class CrossUnit:
    """One OpInfo and dtype for several chips: ``chips`` is ((chip, targets, bf16 emulated, chip hash), ...);
    ``part`` the (start, stop) slice of its cases, () for all."""

    opinfo: str
    dtype: str
    chips: tuple
    part: tuple = ()
    cost: int = 0   # cases x chips (0: not counted), the order the pool takes units in

    @property
    def label(self) -> str:
        cut = f" [{self.part[0]}:{self.part[1]}]" if self.part else ""
        return f"{self.opinfo} {self.dtype}{cut} ({len(self.chips)} chips)"


@dataclass
class _ChipRun:
    report: Report
    claimed: dict
    uncovered: list
    units: list
    done: list
    bf16_emulated: bool = False


def run_unit_across(unit: CrossUnit, url, settings: Settings) -> dict:
    """chip -> (outcome dicts, seconds this chip's planning and running took) of every case
    of ``unit`` (module-level: picklable). Seconds shared by the chips (samples, eager torch,
    traces and captures) are split evenly among them."""
    import torch

    from torchfl.conformance.cases import opinfo_cases
    from torchfl.conformance.execute import Chip, run_cases_on
    from torchfl.planner.target import resolve_target

    t0 = time.thread_time()
    for chip, _targets, _bf16, chip_hash in unit.chips:
        if resolve_target(chip, url, expect_hash=chip_hash).chip_hash != chip_hash:
            raise RuntimeError(f"chip {chip} changed in the registry during the run; run conformance again")
    try:
        cases = _drawn(unit.opinfo, unit.dtype, settings.samples, settings.edge_from, settings.seed)
    except Exception as exc:  # noqa: BLE001 - torch's sample generators refuse a dtype with any type: reported skipped
        skipped = [dict(case=f"{unit.opinfo}", variant="opinfo", layout="contiguous", status="skipped", ops=[],
                        reason=f"no OpInfo samples in {unit.dtype}: {type(exc).__name__}: {exc}"[:300],
                        max_abs_error=None, max_rel_error=None, inputs={})]
        return {chip: (skipped, (time.thread_time() - t0) / len(unit.chips)) for chip, *_ in unit.chips}
    chips = {chip: Chip(tuple(targets), bf16) for chip, targets, bf16, _h in unit.chips}
    first, stop = unit.part or (0, len(cases))
    outcomes = run_cases_on(cases[first:stop], chips, url, first=first)
    share = (time.thread_time() - t0) / len(chips)
    return {chip: ([o.as_dict() for o in outs], share) for chip, outs in outcomes.items()}


def _drawn(opinfo: str, dtype: str, samples, edge_from: int, seed: int) -> list:
    """The cases of ``opinfo`` in ``dtype``, drawn once per process for all the slices of it a
    worker takes (the last few kept: the cases are inputs only, every run copies them)."""
    key = (opinfo, dtype, samples, edge_from, seed)
    if key not in _DRAWN:
        import torch

        from torchfl.conformance.cases import opinfo_cases

        while len(_DRAWN) >= 2:
            _DRAWN.pop(next(iter(_DRAWN)))
        _DRAWN[key] = opinfo_cases(opinfo, getattr(torch, dtype), samples=samples, edge_from=edge_from, seed=seed)
    return _DRAWN[key]


_DRAWN: dict = {}


def _count(opinfo: str, dtype: str, settings: Settings) -> int | None:
    """How many cases (OpInfo, dtype) has, or None where torch's samples refuse the dtype."""
    try:
        return len(_drawn(opinfo, dtype, settings.samples, settings.edge_from, settings.seed))
    except Exception:  # noqa: BLE001 - the worker draws them again and reports the unit skipped with the error
        return None


def cross_units(runs: dict, modes, settings: Settings | None = None) -> list:
    """The compile-mode units of every chip merged per (OpInfo, dtype), then each chip's
    eager-mode units as they are. With ``settings`` drawing more than :data:`CHUNK` cases per
    OpInfo (``--samples all``), each (OpInfo, dtype) is counted and cut in slices of at most
    CHUNK cases, and the units are ordered by cases x chips, largest first, so the pool's last
    tasks are small; else heavy OpInfos first (as ``plan_units`` orders them)."""
    merged: dict = {}
    eager = []
    for chip, r in runs.items():
        for u in r.units:
            if u.mode != "compile":
                eager.append((chip, u, r.bf16_emulated))
                continue
            merged.setdefault((u.opinfo, u.dtype), []).append((chip, u.targets, r.bf16_emulated,
                                                               r.report.identity.chip_hash))
    heavy = ("conv", "attention", "pool", "batch_norm", "layer_norm", "embedding")
    keys = sorted(merged, key=lambda k: (not any(h in k[0] for h in heavy), k))
    if settings is None or (settings.samples is not None and settings.samples <= CHUNK):
        return [CrossUnit(op, dt, tuple(merged[(op, dt)])) for op, dt in keys] + eager
    units = []
    for op, dt in keys:
        chips = tuple(merged[(op, dt)])
        n = _count(op, dt, settings)
        weight = 2 if any(h in op for h in heavy) else 1
        if n is None or n <= CHUNK:
            units.append(CrossUnit(op, dt, chips, (), weight * (n or 1) * len(chips)))
            continue
        units.extend(CrossUnit(op, dt, chips, (at, min(at + CHUNK, n)), weight * (min(at + CHUNK, n) - at) * len(chips))
                     for at in range(0, n, CHUNK))
    _DRAWN.clear()
    units.sort(key=lambda u: -u.cost)   # stable: a unit's slices stay in order
    return units + eager


def run_chips(chips, *, registry=None, settings: Settings = Settings(), progress=None,
              record: bool = True) -> list[Report]:
    """One conformance run per chip of ``chips`` (names in ``registry``), made together; see
    the module docstring. ``progress(done, total, unit, outcomes)`` after each unit (a
    :class:`CrossUnit` or an eager :class:`~torchfl.conformance.harness.Unit`)."""
    from torchfl.registry import open_registry

    reg = open_registry(registry)
    t0 = time.perf_counter()
    runs = {chip: _start(reg, chip, settings) for chip in chips}
    work = cross_units(runs, settings.modes, settings)
    spent = {chip: 0.0 for chip in chips}
    sliced: dict = {}   # (opinfo, dtype) -> [(start, {chip: outcomes})]: a unit's slices, put together at the end
    for n, (unit, result) in enumerate(_execute(work, reg.url, settings, chips), 1):
        if isinstance(unit, CrossUnit):
            for chip, *_ in unit.chips:
                spent[chip] += result[chip][1]
            sliced.setdefault((unit.opinfo, unit.dtype), []).append(
                (unit.part[:1] or (0,), {chip: result[chip][0] for chip, *_ in unit.chips}))
            shown = [o for chip, *_ in unit.chips for o in result[chip][0]]
        else:
            chip, eager_unit, _bf16 = unit
            runs[chip].done.append((eager_unit, result))
            shown = result
        if progress:
            progress(n, len(work), unit if isinstance(unit, CrossUnit) else unit[1], shown)
    targets_of = {(u.opinfo, u.dtype): u.chips for u in work if isinstance(u, CrossUnit)}
    for key, parts in sliced.items():
        parts.sort(key=lambda p: p[0])
        for chip, targets, _bf16, _h in targets_of[key]:
            outcomes = [o for _start_at, by_chip in parts for o in by_chip[chip]]
            runs[chip].done.append((Unit(key[0], key[1], targets, "compile"), outcomes))
    reports = []
    for chip, r in runs.items():
        _finish(reg, chip, r, record)
        r.report.wall_s = time.perf_counter() - t0
        r.report.cpu_s = spent[chip]
        reports.append(r.report)
    return reports


def _start(reg, chip: str, settings: Settings) -> _ChipRun:
    identity = reg.identity(chip)
    hcd = reg.chip(chip, identity.chip_version)
    packs = [reg.pack(name) for name, _v, _h in identity.packs]
    claimed = claims(hcd, packs, settings)
    units, uncovered = plan_units(claimed, settings.modes)
    report = Report(chip, identity, harness_hash(settings), settings, datetime.now(timezone.utc))
    return _ChipRun(report, claimed, uncovered, units, [], bool(hcd.constraints.bfloat16_emulation))


def _finish(reg, chip: str, r: _ChipRun, record: bool) -> None:
    """Aggregate, flag and record one chip's run exactly as ``harness.run`` does."""
    report, claimed = r.report, r.claimed
    rank = {u.label: i for i, u in enumerate(r.units)}
    r.done.sort(key=lambda d: rank[d[0].label])
    report.results, report.skipped, report.unattributed = aggregate(r.done, claimed)
    covered = {(x["op"], x["dtype"]) for x in report.results}
    report.unverified = sorted(set(r.uncovered) | {(op, d) for op, dts in claimed.items() for d in dts
                                                   if (op, d) not in covered})
    if any("bfloat16" in dts for dts in claimed.values()):
        from torchfl.conformance.bf16 import check_native_bf16

        _worker_init_light()
        report.findings = check_native_bf16(chip, reg.url)
    if record:
        from dataclasses import asdict

        report.run_id = reg.record_conformance(
            report.identity, harness_hash=report.harness_hash, started_at=report.started_at,
            settings=dict(asdict(report.settings), unverified=len(report.unverified), skipped_cases=report.skipped,
                          findings=[f.as_dict() for f in report.findings]),
            results=report.results)


def _call(item, url, settings):
    """A pool task: a cross unit, or one chip's eager unit."""
    if isinstance(item, CrossUnit):
        return run_unit_across(item, url, settings)
    chip, unit, bf16_emulated = item
    return run_unit(unit, chip, url, settings, bf16_emulated, None)


def _execute(work, url, settings, chips):
    """Yield ``(item, result)`` as items finish: in this process (jobs 1) or in one pool, where
    every chip under test is an npu device in each worker."""
    import functools

    yield from run_work(work, functools.partial(_call, url=url, settings=settings), url, settings,
                        devices=",".join(chips))
