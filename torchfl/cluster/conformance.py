"""``torchfl conformance`` through a runner: the harness's units as sweep units.

:class:`ConformanceSweep` is the harness's ``execute`` hook (``harness.run(...,
execute=sweep)``): it turns the planned units into :class:`~torchfl.cluster.units.Unit` calls
of ``harness.run_unit`` (key: the unit's label, ``"add float16"``), runs them through a
:class:`~torchfl.cluster.sweep.Sweep` (recorded per unit, resumable) and yields them back as
the harness expects. After the harness aggregated the verdicts, :meth:`finish` stores the
conformance run and the sweep's finish in one transaction.
"""

from __future__ import annotations

from dataclasses import asdict

from torchfl.cluster.sweep import Sweep
from torchfl.cluster.units import Unit

RUN_UNIT = "torchfl.conformance.harness:run_unit"


class ConformanceSweep:
    def __init__(self, runner, *, registry=None, resume: int | None = None):
        self.runner, self.registry, self.resume = runner, registry, resume
        self.sweep: Sweep | None = None
        self.where: dict[str, str] = {}       # unit label -> node it ran on ("resumed" when taken from the run)

    @property
    def run_id(self) -> int | None:
        return None if self.sweep is None else self.sweep.run_id

    def spec(self, chip, settings, chip_hash) -> dict:
        from torchfl.conformance.harness import harness_hash

        reg = self.registry
        identity = reg.identity(chip) if reg is not None else None
        return dict(chip=chip, chip_hash=chip_hash, packs=[list(p) for p in identity.packs] if identity else None,
                    harness_hash=harness_hash(settings), tool_version=identity.tool_version if identity else None,
                    sampling=settings.sampling(), ops=list(settings.ops), dtypes=list(settings.dtypes))

    def __call__(self, units, chip, url, settings, bf16_emulated, chip_hash):
        by_key = {u.label: u for u in units}
        work = [Unit(u.label, RUN_UNIT, (u, chip, url, settings, bf16_emulated, chip_hash)) for u in units]
        eager = "eager" in getattr(settings, "modes", ())
        # the npu device: npu:0 is the chip under test in every worker (as the harness's own pool does)
        self.sweep = Sweep(self.runner, "conformance", f"conformance {chip}", self.spec(chip, settings, chip_hash),
                           work, registry=self.registry, resume=self.resume,
                           process_env={"TORCHFL_DEVICES": chip} if eager else None,
                           unit_env={"TORCHFL_REGISTRY_URL": url} if eager else None)
        for done in self.sweep.run():
            self.where[done.unit] = "resumed" if done.resumed else done.node
            yield by_key[done.unit], done.result

    def finish(self, report) -> tuple[int | None, bool]:
        """Store the report's verdicts as a conformance run and finish the sweep, once:
        ``(conformance run id, written now)``."""
        if self.sweep is None or self.sweep.run_id is None:
            return None, False
        from torchfl.registry.sweeps import Sweeps

        settings = dict(asdict(report.settings), unverified=len(report.unverified), skipped_cases=report.skipped,
                        findings=[f.as_dict() for f in getattr(report, "findings", ())], sweep_run=self.sweep.run_id)
        settings.pop("jobs", None)    # how many workers ran it is no part of what was tested
        return Sweeps(self.registry).finish_conformance(
            self.sweep.run_id, report.identity, harness_hash=report.harness_hash, started_at=report.started_at,
            settings=settings, results=report.results)
