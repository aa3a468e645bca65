"""A first call's compile helpers (``python -m torchfl.kernels.precompile``) kept compiling after
kill -9 of the process they served: a cold cache's helpers ran on for the rest of their list
(tens of seconds of both cores, for nobody). They now end with that process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.processes import descendants, kill_left_behind, still_alive

ROOT = Path(__file__).resolve().parents[2]
PARENT = """
import torch, torchfl
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                        torch.nn.Conv2d(8, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                        torch.nn.Flatten(), torch.nn.Linear(8, 4), torch.nn.Softmax(-1)).eval()
c = torch.compile(m, backend="torchfl", options={"chip": "NPU-V3", "precision": "float16"})
c(torch.randn(2, 3, 16, 16))
"""


def _helpers(pid: int) -> set[int]:
    out = set()
    for child in descendants(pid):
        try:
            if b"torchfl.kernels.precompile" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.add(child)
        except OSError:
            pass
    return out


def test_compile_helpers_end_with_the_process_they_serve(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "TORCHFL_COMPILE_HELPERS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    helpers: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while not helpers and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            helpers = _helpers(proc.pid)
        assert helpers, "no compile helper started (an empty kernel cache should start one)"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        alive = still_alive(helpers, 10)
        assert not alive, f"compile helpers still running after the parent's SIGKILL: {sorted(alive)}"
    finally:
        kill_left_behind(proc, helpers)
