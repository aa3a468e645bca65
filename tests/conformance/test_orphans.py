"""Issue 39: kill -9 or SIGTERM of ``torchfl conformance --jobs 2`` left its two spawn workers
and multiprocessing's resource tracker alive indefinitely (~500 MB RSS each). They now end
with the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import descendants, kill_left_behind, still_alive

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_workers_and_tracker_end_with_the_conformance_process(tmp_path, sig):
    from torchfl.registry import Registry

    url = f"sqlite:///{tmp_path / 'r.db'}"
    Registry(url).init(seed=True)
    ops = "sigmoid,tanh,relu,neg,abs,exp,sin,cos,log,sqrt,rsqrt,silu,gelu,erf,floor,ceil"
    proc = subprocess.Popen([sys.executable, "-m", "torchfl.cli", "conformance", "--registry", url, "--chip", "TFL-X1",
                             "--ops", ops, "--dtypes", "float32", "--samples", "2", "--jobs", "2", "--no-record"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    children: set[int] = set()
    try:
        line = proc.stderr.readline()       # the first finished unit: both workers are running units
        assert "TFL-X1" in line, line + proc.stderr.read()[-2000:]
        children = descendants(proc.pid)
        assert len(children) >= 3, children  # two workers and the resource tracker
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        alive = still_alive(children, 30)
        assert not alive, f"still running after the parent's {sig.name}: {sorted(alive)}"
    finally:
        kill_left_behind(proc, children)   # what a failed run left behind
