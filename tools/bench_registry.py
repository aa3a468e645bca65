"""Registry benchmarks: bulk vs one-by-one import, list/show latency at scale, CLI cold start.

    python tools/bench_registry.py [--backends sqlite,postgres] [--chips 1000] [--versions 5]
                                   [--pg-url postgresql://...] [--runs 5]

Prints one JSON object per line. PostgreSQL: without --pg-url a throw-away server is
started with tests/pg_server.py (initdb/pg_ctl, loopback, fsync off, so PostgreSQL
figures are best-case for disk). SQLite: a file in a temporary directory, WAL, default
``synchronous=FULL``. Cases:

- ``import_one_command``: ``torchfl registry import`` of N generated HCD files, one
  process, one transaction (wall time includes the process start).
- ``import_one_by_one_api``: the same N files, one ``Registry.import_files([f])`` call
  (one transaction) each, in one process.
- ``import_one_by_one_cli``: one ``torchfl registry import FILE`` process per file for a
  sample, extrapolated to N (a shell loop's cost).
- ``list``/``show``: with N chips x V versions stored, in-process latency (median) and CLI
  wall time (median of --runs fresh processes).
- ``cold_start``: ``torchfl registry list`` on the seeded registry, and whether torch or
  numba got imported.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "registry"))

from registry_gen import hcd_text, many, write_hcds  # noqa: E402

from torchfl.registry import Registry  # noqa: E402

EXE = shutil.which("torchfl", path=str(Path(sys.executable).parent)) or "torchfl"


def emit(**row) -> None:
    print(json.dumps(row), flush=True)


CPU: list[float] = []  # user+sys seconds of each CLI process, beside its wall time


def _child_cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def cpu_median(n: int) -> float:
    return round(statistics.median(CPU[-n:]), 3)


def cli(url: str, *args: str) -> float:
    cpu0 = _child_cpu()
    start = time.perf_counter()
    proc = subprocess.run([EXE, "registry", "--registry", url, *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    CPU.append(_child_cpu() - cpu0)
    if proc.returncode != 0:
        raise SystemExit(f"torchfl registry {' '.join(args[:2])} failed: {proc.stderr.strip()}")
    return elapsed


def median_of(fn, runs: int) -> float:
    return statistics.median(fn() for _ in range(runs))


class Backend:
    """Fresh, empty registry URLs on one backend."""

    def __init__(self, name: str, pg_url: str | None, work: Path):
        self.name, self.work, self._n = name, work, 0
        self.server = None
        self.pg_url = pg_url
        if name == "postgres" and not pg_url:
            from pg_server import start_server

            self.server = start_server()

    def fresh(self) -> str:
        self._n += 1
        if self.name == "sqlite":
            return f"sqlite:///{self.work}/bench{self._n}.sqlite3"
        if self.server is not None:
            return self.server.url(self.server.create_database())
        return self.pg_url

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def bench_imports(b: Backend, files: list[str], sample: int) -> None:
    n = len(files)
    url = b.fresh()
    Registry(url).init()
    t = cli(url, "import", *files)
    assert len(Registry(url).chips()) == n
    emit(backend=b.name, case="import_one_command", files=n, seconds=round(t, 3), cpu_s=cpu_median(1),
         per_file_ms=round(1000 * t / n, 2))

    url = b.fresh()
    with Registry(url) as r:
        r.init()
        start = time.perf_counter()
        for f in files:
            r.import_files([f])
        t = time.perf_counter() - start
        assert len(r.chips()) == n
    emit(backend=b.name, case="import_one_by_one_api", files=n, seconds=round(t, 3),
         per_file_ms=round(1000 * t / n, 2))

    url = b.fresh()
    Registry(url).init()
    times = [cli(url, "import", f) for f in files[:sample]]
    per = statistics.median(times)
    emit(backend=b.name, case="import_one_by_one_cli", files=n, sampled=sample,
         median_per_process_s=round(per, 3), median_cpu_s=cpu_median(sample), extrapolated_seconds=round(per * n, 1))


def bench_queries(b: Backend, chips: int, versions: int, runs: int) -> None:
    url = b.fresh()
    with Registry(url) as r:
        r.init()
        items = [(f"c{i}_{v}.hcd", hcd_text(f"Q-{i:04d}", f"1.{v}.0", count=8 + v))
                 for i in range(chips) for v in range(versions)]
        start = time.perf_counter()
        for k in range(0, len(items), 1000):
            r.import_texts(items[k:k + 1000])
        emit(backend=b.name, case="populate", chips=chips, versions=versions, rows=len(items),
             seconds=round(time.perf_counter() - start, 2))

        def timed(fn):
            def run():
                s = time.perf_counter()
                fn()
                return time.perf_counter() - s
            return run

        lst = median_of(timed(lambda: r.chips()), runs)
        show = median_of(timed(lambda: r.record(f"Q-{chips // 2:04d}")), runs * 4)
        hist = median_of(timed(lambda: r.history(f"Q-{chips // 3:04d}")), runs * 4)
        assert r.chips()[0].latest == f"1.{versions - 1}.0"
    emit(backend=b.name, case="api_latency", chips=chips, versions=versions, list_ms=round(1000 * lst, 1),
         show_latest_ms=round(1000 * show, 2), history_ms=round(1000 * hist, 2))
    emit(backend=b.name, case="cli_latency", chips=chips, versions=versions, runs=runs,
         list_s=round(median_of(lambda: cli(url, "list"), runs), 3), list_cpu_s=cpu_median(runs),
         list_json_s=round(median_of(lambda: cli(url, "list", "--json"), runs), 3),
         show_s=round(median_of(lambda: cli(url, "show", f"Q-{chips // 2:04d}"), runs), 3), show_cpu_s=cpu_median(runs),
         show_json_s=round(median_of(lambda: cli(url, "show", f"Q-{chips // 2:04d}", "--json"), runs), 3))


def bench_cold_start(b: Backend, runs: int) -> None:
    url = b.fresh()
    Registry(url).init(seed=True)
    code = ("import sys\nfrom torchfl.cli.main import cli\n"
            f"sys.argv=['torchfl','registry','--registry',{url!r},'list','--json']\n"
            "try:\n    cli(prog_name='torchfl', standalone_mode=False)\nfinally:\n"
            "    print('HEAVY', sorted(m for m in ('torch','numba','alembic','pydantic') if m in sys.modules), "
            "file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    heavy = proc.stderr.strip().rsplit("HEAVY", 1)[-1].strip()
    def plain(cmd):
        def run():
            start = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return time.perf_counter() - start
        return run

    emit(backend=b.name, case="cold_start", runs=runs,
         python_floor_s=round(median_of(plain([sys.executable, "-c", "pass"]), runs), 3),
         torchfl_help_s=round(median_of(plain([EXE, "--help"]), runs), 3),
         registry_list_s=round(median_of(lambda: cli(url, "list"), runs), 3),
         registry_list_cpu_s=cpu_median(runs),
         registry_list_json_s=round(median_of(lambda: cli(url, "list", "--json"), runs), 3),
         heavy_modules_imported=heavy)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--chips", type=int, default=1000)
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cli-sample", type=int, default=20, help="one-by-one CLI imports actually run")
    ap.add_argument("--pg-url", default=None, help="an existing, empty PostgreSQL database to use")
    ap.add_argument("--skip", default="", help="comma list of: imports,queries,cold")
    args = ap.parse_args()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop the server
    skip = set(filter(None, args.skip.split(",")))
    work = Path(tempfile.mkdtemp(prefix="torchfl-bench-"))
    try:
        files = write_hcds(work / "hcds", many("B", args.chips))
        for name in args.backends.split(","):
            b = Backend(name, args.pg_url, work)
            try:
                if "cold" not in skip:
                    bench_cold_start(b, args.runs)
                if "imports" not in skip:
                    bench_imports(b, files, args.cli_sample)
                if "queries" not in skip:
                    bench_queries(b, args.chips, args.versions, args.runs)
            finally:
                b.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit(case="machine", cpus=os.cpu_count(), loadavg=os.getloadavg(), python=sys.version.split()[0])


if __name__ == "__main__":
    main()
