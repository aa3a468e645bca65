#!/usr/bin/env python
"""Score every bundled chip on the bundled published tables and write the runs torchfl ships.

    python tools/bundle_fidelity.py [--out measurements/evidence/fidelity_runs.json]

Why: a chip's out-of-sample check is what the confidence line of ``plan explain``, ``plan
compare`` and ``plan decode`` quotes. Without a recorded ``torchfl fidelity --record`` run, a
fresh install said "not checked out of sample" for every chip, although the bundled tables
check three of them. This tool runs exactly what ``torchfl fidelity --record`` runs (the same
tables, planner and in-sample rule) in a fresh default registry (the bundled chips and rule
packs, nothing else) and writes each chip's run; seeding a registry imports them as fidelity
evidence tied to each chip's content hash (``torchfl.registry.bundled_evidence``), so a chip
changed since reads "stale", never a check it did not get. tests/fidelity/test_bundled_runs.py
re-plans a sample of the rows and fails when the file no longer matches the planner.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "measurements" / "evidence" / "fidelity_runs.json"


def build() -> dict:
    """The runs of every chip the bundled tables name, as the file stores them."""
    from torchfl.fidelity.run import run_rows, score_tables
    from torchfl.fidelity.tables import bundled_tables, load_tables
    from torchfl.planner.target import resolve_target
    from torchfl.registry import Registry
    from torchfl.version import __version__

    registry = Registry(os.environ["TORCHFL_REGISTRY_URL"])
    registry.init(seed=True)

    def resolve(name):
        return resolve_target(name, registry)

    tables = load_tables(bundled_tables())
    total = sum(len(t.rows) for t in tables)
    done = [0]

    def step(row):
        done[0] += 1
        if done[0] % 50 == 0 or done[0] == total:
            print(f"{done[0]}/{total} rows planned", file=sys.stderr, flush=True)

    result = score_tables(tables, resolve, progress=step)
    runs = []
    for name, target in sorted(result.targets.items()):
        table_hashes, rows = run_rows(result, name)
        runs.append(dict(chip_name=name, chip_version=target.version, chip_hash=target.chip_hash,
                         tables=table_hashes, rows=rows))
    return {"generated_by": "python tools/bundle_fidelity.py", "tool_version": __version__, "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TORCHFL_REGISTRY_URL"] = f"sqlite:///{tmp}/registry.db"
        data = build()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    for run in data["runs"]:
        print(f"{run['chip_name']} {run['chip_version']}: {len(run['rows'])} rows", file=sys.stderr)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
