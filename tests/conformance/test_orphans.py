"""Issue 39: kill -9 or SIGTERM of ``torchfl conformance --jobs 2`` left its two spawn workers
and multiprocessing's resource tracker alive indefinitely (~500 MB RSS each). They now end
with the process that started them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a live process; None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else (int(fields[1]), fields[0])


def _descendants(root: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = st[0]
    out, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - out
        out |= frontier
    return out


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
        children = _descendants(proc.pid)
        assert len(children) >= 3, children  # two workers and the resource tracker
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        alive = children
        while alive and time.monotonic() < deadline:
            time.sleep(0.5)
            alive = {pid for pid in alive if _stat(pid) is not None}
        assert not alive, f"still running after the parent's {sig.name}: {sorted(alive)}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in children | _descendants(proc.pid):   # what a failed run left behind
            if _stat(pid) is not None:
                os.kill(pid, signal.SIGKILL)
