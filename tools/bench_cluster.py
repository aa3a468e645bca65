"""The same conformance sweep locally and on a Ray cluster on this machine: the overhead per unit.

    python tools/bench_cluster.py [--ops neg,relu,...] [--chip TFL-X1] [--workers 2] [--json]

Starts a throw-away PostgreSQL (tests/pg_server.py) and a Ray cluster on loopback (a head with
no CPUs and ``--workers`` 1-CPU worker nodes, tests/cluster/ray_cluster.py), then runs
``torchfl conformance`` on the same sweep three times, each a separate driver process:

- ``local``: ``--jobs N`` (N = workers), today's process pool;
- ``cluster cold``: ``--cluster`` right after the cluster started (Ray starts its worker
  processes, each imports torch and the OpInfo database);
- ``cluster warm``: ``--cluster`` again (Ray keeps idle workers alive for a while);
- ``local again``: the local run once more (the first run paid cold file caches).

Per run: wall time of the driver process, the units' own seconds as the registry recorded them
(``sweep_units.seconds``: what ran inside ``execute``), the time outside the units per unit
(``(wall - unit seconds / workers) / units``: the driver's start, dispatch, worker start-up,
registry writes, aggregation) and the overhead per unit against the local run:
``(wall - wall_local) / units`` (the faster of the two local runs). The machine is shared: compare only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ("local", "cluster_cold", "cluster_warm", "local_again")
sys.path.insert(0, str(ROOT))


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHFL_COMPILE_HELPERS="0",
               NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba")))
    env.pop("TORCHFL_REGISTRY_URL", None)
    return env


def _run(url, sweep, extra) -> dict:
    from torchfl.registry import Registry
    from torchfl.registry.sweeps import Sweeps

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torchfl.cli", "conformance", "--registry", url, *sweep, *extra],
                          capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"conformance {' '.join(extra)} failed: {proc.stderr[-2000:]}")
    with Registry(url) as reg:
        run = Sweeps(reg).runs(kind="conformance")[0]
        secs = [u.seconds for u in Sweeps(reg).results(run.id).values()]
        nodes = {u.node.rsplit(" pid", 1)[0] for u in Sweeps(reg).results(run.id).values()}
    return dict(wall_s=round(wall, 1), units=len(secs), unit_s_sum=round(sum(secs), 1),
                unit_s_median=round(statistics.median(secs), 2), nodes=len(nodes), sweep_run=run.id)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chip", default="TFL-X1")
    ap.add_argument("--ops", default="neg,relu,sigmoid,tanh,add,sub,mul,div,gelu,silu")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--samples", default="2")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    from tests.cluster.ray_cluster import RayCluster
    from tests.pg_server import start_server
    from torchfl.registry import Registry

    sweep = ["--chip", a.chip, "--ops", a.ops, "--dtypes", a.dtypes, "--samples", a.samples]
    server = start_server()
    cluster = RayCluster(workers=a.workers, cpus_per_worker=1, env=_env())
    try:
        url = server.url(server.create_database())
        Registry(url).init(seed=True)
        out = {"load_before": os.getloadavg()}
        out["local"] = _run(url, sweep, ["--jobs", str(a.workers)])
        t0 = time.perf_counter()
        cluster.start()
        out["cluster_start_s"] = round(time.perf_counter() - t0, 1)
        out["cluster_cold"] = _run(url, sweep, ["--cluster", cluster.address])
        out["cluster_warm"] = _run(url, sweep, ["--cluster", cluster.address])
        out["local_again"] = _run(url, sweep, ["--jobs", str(a.workers)])   # the first run paid cold file caches
        out["load_after"] = os.getloadavg()
    finally:
        cluster.stop()
        server.stop()
    base = min(out["local"]["wall_s"], out["local_again"]["wall_s"])
    for k in RUNS:
        r = out[k]
        r["overhead_per_unit_s"] = round((r["wall_s"] - base) / r["units"], 2)
        r["outside_units_per_unit_s"] = round((r["wall_s"] - r["unit_s_sum"] / a.workers) / r["units"], 2)
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"sweep: conformance {' '.join(sweep)}; {a.workers} workers (1 CPU each); cluster start "
          f"{out['cluster_start_s']} s")
    print(f"{'run':14s} {'wall':>7s} {'units':>5s} {'unit s (sum)':>12s} {'unit s (median)':>15s} "
          f"{'outside/unit':>12s} {'vs local/unit':>13s} nodes")
    for k in RUNS:
        r = out[k]
        print(f"{k:14s} {r['wall_s']:6.1f}s {r['units']:5d} {r['unit_s_sum']:11.1f}s {r['unit_s_median']:14.2f}s "
              f"{r['outside_units_per_unit_s']:11.2f}s {r['overhead_per_unit_s']:+12.2f}s {r['nodes']:5d}")
    lb, la = out["load_before"], out["load_after"]
    print(f"load average before {lb[0]:.2f} {lb[1]:.2f} {lb[2]:.2f}, after {la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
