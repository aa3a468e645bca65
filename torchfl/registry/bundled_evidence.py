"""The fidelity runs torchfl ships, imported as evidence when a registry is seeded.

Why: the confidence line of every what-if answer quotes the chip's latest out-of-sample
fidelity run. A fresh registry had none, so every chip read "not checked out of sample"
although the bundled tables check several of them. ``tools/bundle_fidelity.py`` writes
``measurements/evidence/fidelity_runs.json`` (the runs ``torchfl fidelity --record`` makes on
the bundled tables); :func:`seed_fidelity` stores each run whose chip hash is the one the
registry publishes for that chip version, once (a second seed finds it and adds nothing). A
chip whose numbers differ from the scored ones is not credited with the run: its hash does
not match, and it stays unchecked (or stale, after a later version), as it should.
"""
from __future__ import annotations

import json
from dataclasses import replace

from torchfl.registry.errors import RegistryError

__all__ = ["BUNDLED_MARK", "bundled_runs", "seed_fidelity"]

#: appended to the tool version of a run imported from the bundled file, so it reads as such
BUNDLED_MARK = " (bundled run)"


def bundled_runs() -> list[dict]:
    """The runs of the bundled file (empty when the installation ships none)."""
    from torchfl.resources import bundled_path

    try:
        path = bundled_path("measurements") / "evidence" / "fidelity_runs.json"
    except FileNotFoundError:
        return []
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return [dict(run, tool_version=data["tool_version"]) for run in data["runs"]]


def seed_fidelity(registry) -> list[str]:
    """Store each bundled run ``registry`` publishes the scored chip version of, unless it is
    already there; returns the chips credited. One transaction per run (``record_fidelity``)."""
    from torchfl.registry.fidelity import fidelity_runs, record_fidelity

    credited = []
    for run in bundled_runs():
        name, version = run["chip_name"], run["chip_version"]
        try:
            identity = registry.identity(name, version)
        except RegistryError:          # the chip, or that version of it, is not in this registry
            continue
        if identity.chip_hash != run["chip_hash"]:
            continue                   # other numbers under the same version: not this run's chip
        tool = run["tool_version"] + BUNDLED_MARK
        if any(r["chip_hash"] == run["chip_hash"] and r["tool_version"] == tool
               for r in fidelity_runs(registry, chip=name)):
            continue
        record_fidelity(registry, replace(identity, tool_version=tool), tables=run["tables"], rows=run["rows"])
        credited.append(name)
    return credited
