"""Cold start of the ``torchfl`` command: wall time of fresh processes, median of N.

    python tools/bench_cli.py [--runs 15] [--json]

Each case runs the installed console script in a new process (what a user's shell does),
so imports, pydantic model building and click parsing are all counted. The budget is
0.5 s for commands that need neither torch nor numba.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cases(exe: str) -> dict[str, list[str]]:
    chips = sorted(str(p) for p in (ROOT / "hcd_registry").glob("*.hcd"))
    return {
        "python_startup": [sys.executable, "-c", "pass"],
        "torchfl_help": [exe, "--help"],
        "hcd_validate_all": [exe, "hcd", "validate", "-q", *chips],
        "hcd_schema": [exe, "hcd", "schema"],
    }


def measure(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    exe = shutil.which("torchfl", path=str(Path(sys.executable).parent)) or "torchfl"
    for name, cmd in cases(exe).items():
        measure(cmd, 2)  # warm the page cache
        s = measure(cmd, args.runs)
        row = {"case": name, "median_s": round(s, 4), "runs": args.runs, "budget_s": 0.5}
        print(json.dumps(row) if args.json else f"{name:20s} {s * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
