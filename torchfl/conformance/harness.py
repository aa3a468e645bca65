"""``torchfl conformance``: every claimed overload of a chip, run on OpInfo samples, as evidence.

1. The claims: what ``registry ops --chip`` says the rule packs map on the chip (overload
   and dtypes), filtered by ``--ops`` / ``--dtypes``.
2. The work: one unit per (OpInfo, dtype) that may exercise a claimed overload
   (``opinfos.py``); a unit's cases (``cases.py``) run strictly on the chip
   (``execute.py``). Units are sharded over worker processes, each single-threaded.
3. The verdicts: each case counts for the claimed overloads its graph contained, under the
   layout of its inputs (``eager <layout>`` for the npu device's runs, ``--mode eager``);
   per (overload, dtype, layout) ``pass`` (every case matched), ``refused`` (every case
   refused before running), ``fail`` (none matched, some wrong) or ``partial`` (some
   matched, some did not). The run's summary per overload is the claim state the registry
   will show (``registry.evidence.claim_state``). A chip whose HCD claims native bfloat16
   is probed beyond float16's range (``bf16.py``); a failure is a finding of the run.
4. The record: one conformance run in the registry, tied to the chip's content hash, the
   packs, torchfl's version and :func:`harness_hash`.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from torchfl.hcd.dtypes import STORAGE
from torchfl.kernels.lifetime import die_with_parent

#: dtypes the harness can draw OpInfo samples in (torch dtypes by short name)
TESTABLE = tuple(STORAGE)   # every storage dtype of the emulated chip


MODES = ("compile", "eager")


@dataclass(frozen=True)
class Settings:
    samples: int | None = 4   # OpInfo samples per (OpInfo, dtype); None: every sample op_db has
    edge_from: int = 1        # edge-case variants of the first N of them
    ops: tuple = ()           # fnmatch patterns on overload names ("aten.add.*", "*softmax*"); () = all
    dtypes: tuple = ()        # () = every dtype the chip claims
    jobs: int = 2
    seed: int = 0
    modes: tuple = ("compile",)   # compile: torch.compile(backend="torchfl"); eager: the npu device

    def sampling(self) -> dict:
        """What decides which cases run (hashed with the harness; ``jobs`` is not)."""
        return dict(samples=self.samples, edge_from=self.edge_from, seed=self.seed, modes=list(self.modes))


@dataclass
class Unit:
    opinfo: str
    dtype: str
    targets: tuple            # claimed overloads it may exercise in this dtype
    mode: str = "compile"     # compile | eager

    @property
    def label(self) -> str:
        return f"{self.opinfo} {self.dtype}" + ("" if self.mode == "compile" else f" ({self.mode})")


@dataclass
class Report:
    """One chip's conformance run (what ``--json`` prints and the registry stores)."""

    chip: str
    identity: object
    harness_hash: str
    settings: Settings
    started_at: datetime
    results: list = field(default_factory=list)      # rows for the registry (evidence.check_result)
    unverified: list = field(default_factory=list)   # claimed (op, dtype) no case exercised
    findings: list = field(default_factory=list)     # chip-level checks that failed (bf16.Finding)
    skipped: int = 0
    unattributed: int = 0
    wall_s: float = 0.0
    cpu_s: float | None = None   # a run of several chips: this chip's worker CPU seconds (shared work split evenly)
    run_id: int | None = None

    def counts(self) -> dict:
        """Overloads by the state their evidence gives them, exactly as ``conformance --report``
        and ``registry ops`` will show this run (``registry.evidence.claim_state`` over the
        overload's rows in every dtype and layout), and the unverified ones."""
        state = op_states(self.results)
        out = {v: sum(1 for s in state.values() if s == STATE_OF[v]) for v in ("pass", "partial", "fail", "refused")}
        out["unverified"] = len({op for op, _d in self.unverified} - set(state))
        out["cases"] = sum(r["samples"] for r in self.results)
        return out

    def as_dict(self) -> dict:
        return dict(chip=self.identity.as_dict(), harness_hash=self.harness_hash, settings=asdict(self.settings),
                    started_at=self.started_at.isoformat(), wall_s=round(self.wall_s, 1),
                    cpu_s=None if self.cpu_s is None else round(self.cpu_s, 1), run=self.run_id,
                    overloads=self.counts(), skipped_cases=self.skipped, unattributed_cases=self.unattributed,
                    results=self.results, unverified=[{"op": o, "dtype": d} for o, d in self.unverified],
                    findings=[f.as_dict() for f in self.findings])


#: a verdict word of the run's summary -> the claim state the stored evidence shows
STATE_OF = {"pass": "verified", "partial": "partial", "fail": "failing", "refused": "refused"}


def op_states(rows) -> dict[str, str]:
    """Overload -> its claim state over ``rows`` (one per dtype and layout), by the registry's
    own rule, so the run's summary and the stored report cannot disagree."""
    from types import SimpleNamespace

    from torchfl.registry.evidence import claim_state

    by_op: dict[str, list] = {}
    for r in rows:
        by_op.setdefault(r["op"], []).append(SimpleNamespace(verdict=r["verdict"], stale=()))
    return {op: claim_state(ev) for op, ev in by_op.items()}


def harness_hash(settings: Settings) -> str:
    """SHA-256 of the harness's source, torch's version (op_db's samples) and the sampling settings."""
    import torch

    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(torch.__version__.encode())
    h.update(json.dumps(settings.sampling(), sort_keys=True).encode())
    return h.hexdigest()


def _matches(op: str, patterns) -> bool:
    if not patterns:
        return True
    short = op.removeprefix("aten.")
    return any(fnmatch.fnmatchcase(op, p) or fnmatch.fnmatchcase(short, p) or short.split(".")[0].lstrip("_") == p
               for p in patterns)


def claims(hcd, packs, settings: Settings) -> dict[str, tuple]:
    """Claimed overload -> dtypes on this chip (``registry ops``), filtered by the settings."""
    from torchfl.rules.support import chip_ops

    out = {}
    for entry in chip_ops(hcd, packs)["ops"]:
        if not _matches(entry["op"], settings.ops):
            continue
        dts = tuple(d for d in entry["dtypes"] if d in TESTABLE and (not settings.dtypes or d in settings.dtypes))
        if dts:
            out[entry["op"]] = dts
    return out


def plan_units(claimed: dict[str, tuple], modes=("compile",)) -> tuple[list[Unit], list[tuple]]:
    """(units, claims no OpInfo covers) for the claimed overloads and dtypes, in each mode."""
    from torchfl.conformance.opinfos import OPINFOS, opinfos_for

    units = []
    for name, overloads in opinfos_for(claimed).items():
        for dtype in TESTABLE:
            targets = tuple(op for op in overloads if dtype in claimed[op])
            if targets:
                units.extend(Unit(name, dtype, targets, mode) for mode in modes)
    uncovered = [(op, d) for op, dts in sorted(claimed.items()) if op not in OPINFOS for d in dts]
    # heavy OpInfos first, so the last shard does not start with a convolution
    heavy = ("conv", "attention", "pool", "batch_norm", "layer_norm", "embedding")
    units.sort(key=lambda u: (not any(h in u.opinfo for h in heavy), u.opinfo, u.dtype))
    return units, uncovered


# ---------------------------------------------------------------- workers

def _worker_init(parent: int | None = None) -> None:
    """One thread per worker process: the shards are the parallelism. The worker ends with
    ``parent`` (the conformance process), however that ends."""
    die_with_parent(parent)
    import logging
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


def run_unit(unit: Unit, chip: str, registry, settings: Settings, bf16_emulated: bool,
             chip_hash: str | None = None) -> list[dict]:
    """Every case of ``unit`` on ``chip``: a list of ``Outcome.as_dict()`` (module-level: picklable)."""
    import torch

    from torchfl.conformance.cases import opinfo_cases
    from torchfl.conformance.execute import run_cases

    if chip_hash is not None:
        from torchfl.planner.target import resolve_target

        if resolve_target(chip, registry, expect_hash=chip_hash).chip_hash != chip_hash:
            raise RuntimeError(f"chip {chip} changed in the registry during the run; run conformance again")
    try:
        cases = opinfo_cases(unit.opinfo, getattr(torch, unit.dtype), samples=settings.samples,
                             edge_from=settings.edge_from, seed=settings.seed)
    except Exception as exc:  # noqa: BLE001 - torch's sample generators refuse a dtype with any type: reported skipped
        return [dict(case=f"{unit.opinfo}", variant="opinfo", layout="contiguous", status="skipped", ops=[],
                     reason=f"no OpInfo samples in {unit.dtype}: {type(exc).__name__}: {exc}"[:300],
                     max_abs_error=None, max_rel_error=None, inputs={})]
    if unit.mode == "eager":
        from torchfl.conformance.eager_case import run_case_eager

        outcomes = [run_case_eager(c, chip=chip, bf16_emulated=bf16_emulated, targets=unit.targets) for c in cases]
        return [dict(o.as_dict(), layout=f"eager {o.layout}") for o in outcomes]
    outcomes = run_cases(cases, chip=chip, registry=registry, bf16_emulated=bf16_emulated, targets=unit.targets)
    return [o.as_dict() for o in outcomes]


# ---------------------------------------------------------------- verdicts

def verdict(passed: int, failed: int, refused: int) -> str:
    if passed and not (failed or refused):
        return "pass"
    if refused and not (passed or failed):
        return "refused"
    if passed:
        return "partial"
    return "fail"


def aggregate(units_outcomes, claimed: dict[str, tuple]) -> tuple[list[dict], int, int]:
    """(result rows, skipped cases, unattributed cases) from ``[(unit, [outcome dict])]``."""
    cells: dict[tuple, list] = {}
    skipped = unattributed = 0
    for unit, outcomes in units_outcomes:
        for o in outcomes:
            if o["status"] == "skipped":
                skipped += 1
                continue
            hit = [op for op in unit.targets if op in o["ops"]]
            if not hit and not o["ops"] and len(unit.targets) == 1:
                hit = list(unit.targets)   # refused before capture: its only target
            if o["status"] == "refused" and "aten." in (o["reason"] or ""):
                # refused because of a named op: evidence against that op only, not the others
                # in its graph (a matmul sample refused for its squeeze says nothing about mm)
                hit = [op for op in hit if op in o["reason"]]
            if not hit:
                unattributed += 1
                continue
            for op in hit:
                cells.setdefault((op, unit.dtype, o["layout"]), []).append(o)
    rows = []
    for (op, dtype, layout), outs in sorted(cells.items()):
        n = {s: sum(1 for o in outs if o["status"] == s) for s in ("pass", "fail", "refused")}
        errs = [o for o in outs if o["max_abs_error"] is not None]
        first_bad = next((o for o in outs if o["status"] == "fail"), None) or \
            next((o for o in outs if o["status"] == "refused"), None)
        rows.append(dict(
            op=op, dtype=dtype, layout=layout, verdict=verdict(n["pass"], n["fail"], n["refused"]),
            samples=len(outs), passed=n["pass"], failed=n["fail"], refused=n["refused"],
            max_abs_error=max((o["max_abs_error"] for o in errs), default=None),
            max_rel_error=max((o["max_rel_error"] or 0.0 for o in errs), default=None),
            reason=first_bad["reason"] if first_bad else None,
            first_failure=None if first_bad is None else dict(first_bad["inputs"], status=first_bad["status"],
                                                              reason=first_bad["reason"])))
    return rows, skipped, unattributed


# ---------------------------------------------------------------- the run

def run(chip: str, *, registry=None, settings: Settings = Settings(), progress=None, record: bool = True,
        execute=None) -> Report:
    """Run the conformance matrix of ``chip`` (a name in ``registry``); see the module docstring.

    ``progress(done, total, unit, outcomes)`` is called after each unit. With ``record``
    the run is stored in the registry as evidence (``Report.run_id``). ``execute`` replaces
    how units are run (same signature and yield as ``_execute``): ``torchfl.cluster`` runs
    them on Ray or records each unit once for ``--resume``."""
    import time

    from torchfl.registry import open_registry

    reg = open_registry(registry)
    url = reg.url
    identity = reg.identity(chip)
    hcd = reg.chip(chip, identity.chip_version)
    packs = [reg.pack(name) for name, _v, _h in identity.packs]
    claimed = claims(hcd, packs, settings)
    units, uncovered = plan_units(claimed, settings.modes)
    report = Report(chip, identity, harness_hash(settings), settings, datetime.now(timezone.utc))
    bf16_emulated = bool(hcd.constraints.bfloat16_emulation)
    t0 = time.perf_counter()
    done: list = []
    for unit, outcomes in (execute or _execute)(units, chip, url, settings, bf16_emulated, identity.chip_hash):
        done.append((unit, outcomes))
        if progress:
            progress(len(done), len(units), unit, outcomes)
    rank = {u.label: i for i, u in enumerate(units)}   # units finish in any order; verdicts must not depend on it
    done.sort(key=lambda d: rank[d[0].label])
    report.results, report.skipped, report.unattributed = aggregate(done, claimed)
    covered = {(r["op"], r["dtype"]) for r in report.results}
    report.unverified = sorted(set(uncovered) | {(op, d) for op, dts in claimed.items() for d in dts
                                                 if (op, d) not in covered})
    if any("bfloat16" in dts for dts in claimed.values()):
        from torchfl.conformance.bf16 import check_native_bf16

        _worker_init_light()
        report.findings = check_native_bf16(chip, url)
    report.wall_s = time.perf_counter() - t0
    if record:
        report.run_id = reg.record_conformance(
            identity, harness_hash=report.harness_hash, started_at=report.started_at,
            settings=dict(asdict(settings), unverified=len(report.unverified), skipped_cases=report.skipped,
                          findings=[f.as_dict() for f in report.findings]),
            results=report.results)
    return report


def _execute(units, chip, url, settings, bf16_emulated, chip_hash):
    """Yield ``(unit, outcomes)`` as units finish: in this process (jobs 1) or sharded."""
    import functools

    run = functools.partial(run_unit, chip=chip, registry=url, settings=settings, bf16_emulated=bf16_emulated,
                            chip_hash=chip_hash)
    yield from run_work(units, run, url, settings, devices=chip)   # npu:0 is the chip under test


def run_work(work, fn, url, settings, devices: str):
    """Yield ``(item, fn(item))`` as items finish: in this process (jobs 1, or one item) or in one
    pool of ``settings.jobs`` spawn workers (``fn`` picklable: a module-level function or a
    partial of one). A worker has one thread, the run's registry and, for eager-mode units,
    ``devices`` as its ``TORCHFL_DEVICES``; it ends with this process (``_worker_init``)."""
    if settings.jobs <= 1 or len(work) <= 1:
        _worker_init_light()
        for item in work:
            yield item, fn(item)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "TORCHFL_REGISTRY_URL": url}
    if "eager" in settings.modes:
        env["TORCHFL_DEVICES"] = devices
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)   # inherited by the spawned workers only for their start
    try:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=settings.jobs, mp_context=ctx, initializer=_worker_init,
                                 initargs=(os.getpid(),)) as pool:
            futures = {pool.submit(fn, item): item for item in work}
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _worker_init_light() -> None:
    """In-process runs (tests, ``--jobs 1``): quiet torch's warnings, keep the caller's threads."""
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
