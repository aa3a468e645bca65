"""The compile helpers start when a graph reaches the backend, before capture and planning, where
the kernel cache holds no kernel (``precompile.prestart``): a new user's first call then has them
importing numba and the kernels while it captures and plans (started at the first compile, a BERT
layer's GEMM tile, the critical path of its first call, began 1-2 s later). Checked on real
processes: the pre-started helpers are the ones given the calls, the call's output is the same as
without helpers, a warm cache starts none early, and helpers never given work end with their
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.processes import still_alive

ROOT = Path(__file__).resolve().parents[2]

CALL = """
import json, torch, torchfl
from torchfl.kernels import jitcache, precompile
seen = {}
_orig = precompile.prestart
def prestart():
    n = _orig()
    seen.setdefault("prestarted", [p.pid for p in precompile._waiting])
    return n
precompile.prestart = prestart
holds = jitcache.holds_kernels()
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.Linear(48, 8)).eval()
x = torch.randn(16, 32)
c = torch.compile(m, backend="torchfl", options={"chip": "NPU-V3", "precision": "float16"})
with torch.no_grad():
    y = c(x)
given = [p.pid for h in precompile._running for p in h.procs]
for h in precompile._running:
    h.wait(300)
print(json.dumps({"holds_before": holds, "prestarted": seen.get("prestarted"), "given": given,
                  "waiting": len(precompile._waiting), "y": y.tolist()}))
"""

UNUSED = """
import json
from torchfl.kernels import precompile
print(json.dumps([precompile.prestart(), [p.pid for p in precompile._waiting]]))
"""


def _run(script, tmp_path, helpers="2"):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "XDG_CACHE_HOME": str(tmp_path / "cache"), "TORCHFL_COMPILE_HELPERS": helpers}
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def test_helpers_prestarted_on_an_empty_cache_take_the_first_call(tmp_path):
    cold = json.loads(_run(CALL, tmp_path))
    assert cold["holds_before"] is False
    assert len(cold["prestarted"]) == 2, cold                     # started at the backend, before planning
    assert sorted(cold["given"]) == sorted(cold["prestarted"])     # ... and they got the calls
    assert cold["waiting"] == 0
    warm = json.loads(_run(CALL, tmp_path))                        # the same cache, now holding kernels
    assert warm["holds_before"] is True and warm["prestarted"] == [] and warm["given"] == []
    assert cold["y"] == warm["y"]


def test_prestarted_helpers_never_given_work_end_with_their_process(tmp_path):
    n, pids = json.loads(_run(UNUSED, tmp_path))
    assert n == 2 and len(pids) == 2
    assert not still_alive(set(pids), 30), "pre-started helpers outlived their process"
    assert json.loads(_run(UNUSED, tmp_path / "off", helpers="0")) == [0, []]   # helpers off: none early
