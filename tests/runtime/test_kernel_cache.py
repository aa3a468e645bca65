"""First use: one kernel cache for every entry point, progress that is seen.

Real processes with a fresh user cache directory (no ``NUMBA_CACHE_DIR``): a model's first
``torch.compile`` call compiles its kernels into the default cache and says so once on the
``torchfl`` logger; a second process loads them (and says nothing); ``torchfl kernels info``
shows where they are and which functions are compiled. Progress lines when output is not a
terminal: a line per kernel compile and a periodic line while nothing else is printed.
"""
import io
import json
import os
import subprocess
import sys
import time

SCRIPT = """
import torch
m = torch.nn.ReLU()
c = torch.compile(m, backend="torchfl", options={"chip": "TFL-X1"})
x = torch.randn(4, 8)
assert torch.equal(c(x), m(x))
import os
print("CACHE", os.environ["NUMBA_CACHE_DIR"])
"""
NOTICE = "compiling the emulator's kernels for this model"


def _env(tmp_path, registry_url):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg-cache"), TORCHFL_REGISTRY_URL=registry_url)
    return env


def test_one_default_kernel_cache_for_torch_compile_and_the_cli(tmp_path, registry_url):
    env = _env(tmp_path, registry_url)
    first = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    cache = first.stdout.split("CACHE ", 1)[1].strip()
    assert cache.startswith(str(tmp_path / "xdg-cache" / "torchfl" / "numba" / "torchfl-"))
    assert "_numba-" in cache and cache.endswith(f"_py{sys.version_info[0]}{sys.version_info[1]}")
    assert first.stderr.count(NOTICE) == 1, first.stderr[-2000:]
    # a second process loads what the first compiled: nothing to compile, nothing to announce
    second = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.split("CACHE ", 1)[1].strip() == cache and NOTICE not in second.stderr
    info = subprocess.run([sys.executable, "-m", "torchfl.cli", "kernels", "info", "--json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    assert data["path"] == cache and data["source"].startswith("default") and data["bytes"] > 0
    fns = {(f["family"], f["function"]) for f in data["functions"]}
    assert ("elementwise", "apply") in fns, fns
    assert all(f["specialisations"] >= 1 and not f["stale"] for f in data["functions"])
    text = subprocess.run([sys.executable, "-m", "torchfl.cli", "kernels", "info"], env=env,
                          capture_output=True, text=True, timeout=120).stdout
    assert f"kernel cache: {cache}" in text and "elementwise" in text
    # the user's choice wins
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "mine")
    data = json.loads(subprocess.run([sys.executable, "-m", "torchfl.cli", "kernels", "info", "--json"],
                                     env=env, capture_output=True, text=True, timeout=120).stdout)
    assert data["path"] == str(tmp_path / "mine") and data["source"] == "$NUMBA_CACHE_DIR" and not data["exists"]


HELPER_SCRIPT = """
import torch
from torchfl.kernels import compiling, precompile
from torchfl.planner import plan_module
from torchfl.runtime.executor import Executor

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.softmax(self.lin(torch.relu(x)) * 2.0, dim=-1)

torch.manual_seed(0)
m, x = M().eval(), torch.randn(4, 16)
ex = Executor(plan_module(m, (x,), chip="TFL-X1", precision="float16"))
calls = ex._calls_after(-1)
assert {c.kernel for c in calls} >= {"softmax", "linear"}, calls
assert [c.frozen for c in calls if c.kernel == "linear"] == [("w", "bias")], calls
helper = precompile.start(ex.chip, calls)
assert helper is not None and helper.wait(timeout=600) == 0
compiled = []
compiling.subscribe(lambda ev: compiled.append(ev.function) if ev.kind == "end" else None)
with torch.no_grad():
    for _ in range(2):      # the second call reads the frozen weight (its own GEMM path)
        (y,) = ex.run((x,))
        assert torch.allclose(y, m(x), rtol=1e-2, atol=1e-2)
print("COMPILED_HERE", sorted(compiled))
"""


def test_compile_helper_compiles_what_the_executor_then_loads(tmp_path, registry_url):
    """The helper's scratch calls compile the very specialisations the executor's runs need,
    the first and the later ones (a frozen weight takes another GEMM path): after it, the
    runs load every kernel from the cache and compile none."""
    env = dict(_env(tmp_path, registry_url), NUMBA_CACHE_DIR=str(tmp_path / "numba"), TORCHFL_COMPILE_HELPERS="0")
    out = subprocess.run([sys.executable, "-c", HELPER_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "COMPILED_HERE []" in out.stdout, out.stdout


def test_progress_lines_when_output_is_not_a_terminal():
    from numba import njit

    from torchfl.cli.progress import Progress
    from torchfl.kernels.compiling import labelled

    @njit(cache=False)
    def toy(a):
        s = 0.0
        for x in a:
            s += x * x
        return s

    import numpy as np

    out = io.StringIO()
    with Progress(out, "toy work", total=2, interval=0.4, tty=False) as p:
        with labelled("toy (float64)"):
            toy(np.ones(4))
        p.advance()
        time.sleep(1.0)
        p.update("toy work, phase two")
        p.advance()
    lines = out.getvalue().splitlines()
    assert all(line.startswith("[") and line[9] == "]" for line in lines), lines   # [HH:MM:SS]
    assert any("compiling toy (float64) ... " in line and line.endswith(" s") for line in lines), lines
    assert any("still working" in line for line in lines), lines
    assert any(line.endswith("toy work, phase two (1/2)") for line in lines), lines
    assert "done: toy work, phase two (2/2)" in lines[-1] and "compiled 1 kernel function(s)" in lines[-1]


def test_warmup_runs_jobs_in_worker_processes_and_resumes(registry_url):
    """Real worker processes on the session's kernel cache (so mostly loads): both jobs run,
    are recorded beside the cache, and a second warmup skips them."""
    from torchfl.kernels import jitcache

    env = dict(os.environ, NUMBA_CACHE_DIR=str(jitcache.configure()), TORCHFL_REGISTRY_URL=registry_url)
    cmd = [sys.executable, "-m", "torchfl.cli", "kernels", "warmup", "--model", "mlp", "--chip", "TFL-X1",
           "--chip", "NPU-V3", "-j", "2"]
    out = subprocess.run(cmd + ["--force"], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    done = [ln for ln in lines if "] done: mlp@" in ln]
    assert len(done) == 2, out.stdout
    assert sum("] started: mlp@" in ln for ln in lines) == 2 and "warmup finished in" in out.stdout
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "already warmed up (kernel sources unchanged): mlp@TFL-X1, mlp@NPU-V3" \
        in again.stdout, again.stdout
    info = json.loads(subprocess.run([sys.executable, "-m", "torchfl.cli", "kernels", "info", "--json"], env=env,
                                     capture_output=True, text=True, timeout=120).stdout)
    assert {"mlp@TFL-X1", "mlp@NPU-V3"} <= set(info["warmup_jobs_done"])
