"""One sweep: its units through a runner, recorded in the registry, resumable.

    sweep = Sweep(runner, "compare", "resnet18 on 6 chips", spec, units, registry=reg)
    for done in sweep.run():          # as units finish, wherever they ran
        ...
    sweep.finish({"rows": 6})         # once

``spec`` says what the sweep computes (model, chips, settings, versions): a resumed run
(``resume=RUN``) must have the same kind, spec and unit keys, or it is refused with what
differs; its stored units are yielded first (``Done.resumed``), then the missing ones run.
Without ``registry`` (``--no-record``) nothing is written and nothing can be resumed.
"""

from __future__ import annotations

import socket
from typing import Iterator

from torchfl.cluster import ClusterError
from torchfl.cluster.fingerprint import local
from torchfl.cluster.units import Done, Job, Unit


class ResumeRefused(ClusterError):
    """``--resume RUN`` names a run that is not this sweep."""

    exit_code = 1


class Sweep:
    def __init__(self, runner, kind: str, label: str, spec: dict, units: list[Unit], *, registry=None,
                 resume: int | None = None, process_env: dict | None = None, unit_env: dict | None = None):
        self.runner, self.kind, self.label, self.spec = runner, kind, label, spec
        self.units = list(units)
        self.resume = resume
        self.registry = registry
        self.process_env = tuple(sorted((process_env or {}).items()))
        self.unit_env = tuple(sorted((unit_env or {}).items()))
        self.sweeps = None
        self.info = None          # the registry's SweepRun once opened
        if registry is not None:
            from torchfl.registry.sweeps import Sweeps

            self.sweeps = Sweeps(registry)
        elif resume is not None:
            raise ResumeRefused("--resume needs the run's registry: drop --no-record")

    @property
    def run_id(self) -> int | None:
        return None if self.info is None else self.info.id

    def open(self):
        """Create the run, or load and check the resumed one; returns the SweepRun (None unrecorded)."""
        if self.sweeps is None or self.info is not None:
            return self.info
        if self.resume is None:
            self.info = self.sweeps.start(self.kind, self.label, self.spec, [u.key for u in self.units],
                                          driver=socket.gethostname())
            return self.info
        from torchfl.registry.sweeps import encode, spec_hash

        run = self.sweeps.get(self.resume)
        if run.kind != self.kind:
            raise ResumeRefused(f"run {run.id} is a {run.kind} sweep ({run.label}), not {self.kind}; "
                                f"resume it with the command that started it")
        if run.spec_hash != spec_hash(self.spec):
            diffs = [k for k in sorted(set(run.spec) | set(self.spec))
                     if encode(run.spec.get(k)) != encode(self.spec.get(k))]
            shown = "; ".join(f"{k}: run {_brief(run.spec.get(k))}, now {_brief(self.spec.get(k))}" for k in diffs[:4])
            raise ResumeRefused(f"run {run.id} ({run.label}) was another sweep: {shown}; resume it with the same "
                                "options and the same torchfl, chips and rule packs, or start a new run")
        if set(run.units) != {u.key for u in self.units}:
            raise ResumeRefused(f"run {run.id} ({run.label}) had other units ({len(run.units)}) than this sweep "
                                f"({len(self.units)}); start a new run")
        self.info = run
        return run

    def run(self) -> Iterator[Done]:
        """Yield every unit's :class:`Done`: stored ones first on a resumed run, then the rest as they finish."""
        self.open()
        stored = {}
        if self.info is not None and self.resume is not None:
            stored = self.sweeps.results(self.info.id)
            for unit in self.units:
                if unit.key in stored:
                    s = stored[unit.key]
                    yield Done(unit.key, s.result, s.node, s.seconds, resumed=True)
        todo = [u for u in self.units if u.key not in stored]
        if not todo:
            return
        job = Job(local(), self.registry.url if self.registry is not None else None, self.run_id,
                  process_env=self.process_env, unit_env=self.unit_env)
        yield from self.runner.run(todo, job)

    def finish(self, outcome: dict, write=None) -> tuple[dict, bool]:
        """Record the finished run once (see ``Sweeps.finish``); unrecorded: ``(outcome, False)``."""
        if self.sweeps is None or self.info is None:
            return outcome, False
        return self.sweeps.finish(self.info.id, outcome, write=write)

    def partial_note(self) -> str | None:
        """What to tell the user when the sweep stopped before its end."""
        if self.info is None:
            return None
        done = len(self.sweeps.results(self.info.id))
        return (f"sweep run {self.info.id} stopped with {done} of {len(self.units)} units recorded; finish it with "
                f"--resume {self.info.id}")


def run_sweep(runner, kind: str, label: str, spec: dict, units: list[Unit], *, registry, resume, echo, state: dict,
              on_done=None) -> dict:
    """``{unit key: result}`` of a recorded sweep, a progress line per unit through ``echo``
    (``on_done(done)`` too, if given), finished once when every unit is in. The Sweep is put in
    ``state["sweep"]`` first, so that a caller can say how to resume it if it stops."""
    from datetime import datetime

    sweep = Sweep(runner, kind, label, spec, units, registry=registry, resume=resume)
    state["sweep"] = sweep
    sweep.open()
    if sweep.run_id is not None:
        echo(f"sweep run {sweep.run_id}: {len(units)} units of {label} on {runner.describe()}")
    out = {}
    for done in sweep.run():
        out[done.unit] = done.result
        where = "resumed" if done.resumed else f"{done.node}, {done.seconds:.1f} s"
        echo(f"[{datetime.now():%H:%M:%S}] {kind} {len(out)}/{len(units)} {done.unit} ({where})")
        if on_done is not None:
            on_done(done)
    sweep.finish({"units": len(out)})
    return out


def _brief(value) -> str:
    from torchfl.registry.sweeps import encode

    text = encode(value)
    return text if len(text) <= 60 else text[:57] + "..."
