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


@dataclass
class CrossUnit:
    """One OpInfo and dtype for several chips: ``chips`` is ((chip, targets, bf16 emulated, chip hash), ...)."""

    opinfo: str
    dtype: str
    chips: tuple

    @property
    def label(self) -> str:
        return f"{self.opinfo} {self.dtype} ({len(self.chips)} chips)"


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
        cases = opinfo_cases(unit.opinfo, getattr(torch, unit.dtype), samples=settings.samples,
                             edge_from=settings.edge_from, seed=settings.seed)
    except Exception as exc:  # noqa: BLE001 - torch's sample generators refuse a dtype with any type: reported skipped
        skipped = [dict(case=f"{unit.opinfo}", variant="opinfo", layout="contiguous", status="skipped", ops=[],
                        reason=f"no OpInfo samples in {unit.dtype}: {type(exc).__name__}: {exc}"[:300],
                        max_abs_error=None, max_rel_error=None, inputs={})]
        return {chip: (skipped, (time.thread_time() - t0) / len(unit.chips)) for chip, *_ in unit.chips}
    chips = {chip: Chip(tuple(targets), bf16) for chip, targets, bf16, _h in unit.chips}
    outcomes = run_cases_on(cases, chips, url)
    share = (time.thread_time() - t0) / len(chips)
    return {chip: ([o.as_dict() for o in outs], share) for chip, outs in outcomes.items()}


def cross_units(runs: dict, modes) -> list:
    """The compile-mode units of every chip merged per (OpInfo, dtype), heavy ones first (as
    ``plan_units`` orders them), then each chip's eager-mode units as they are."""
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
    return [CrossUnit(op, dt, tuple(merged[(op, dt)])) for op, dt in keys] + eager


def run_chips(chips, *, registry=None, settings: Settings = Settings(), progress=None,
              record: bool = True) -> list[Report]:
    """One conformance run per chip of ``chips`` (names in ``registry``), made together; see
    the module docstring. ``progress(done, total, unit, outcomes)`` after each unit (a
    :class:`CrossUnit` or an eager :class:`~torchfl.conformance.harness.Unit`)."""
    from torchfl.registry import Registry

    reg = registry if isinstance(registry, Registry) else Registry(registry)
    t0 = time.perf_counter()
    runs = {chip: _start(reg, chip, settings) for chip in chips}
    work = cross_units(runs, settings.modes)
    spent = {chip: 0.0 for chip in chips}
    for n, (unit, result) in enumerate(_execute(work, reg.url, settings, chips), 1):
        if isinstance(unit, CrossUnit):
            for chip, targets, _bf16, _h in unit.chips:
                outcomes, seconds = result[chip]
                runs[chip].done.append((Unit(unit.opinfo, unit.dtype, targets, "compile"), outcomes))
                spent[chip] += seconds
            shown = [o for chip, *_ in unit.chips for o in result[chip][0]]
        else:
            chip, eager_unit, _bf16 = unit
            runs[chip].done.append((eager_unit, result))
            shown = result
        if progress:
            progress(n, len(work), unit if isinstance(unit, CrossUnit) else unit[1], shown)
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
