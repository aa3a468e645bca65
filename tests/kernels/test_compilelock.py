"""Claims keep two processes from compiling one kernel specialisation at once
(torchfl.kernels.compilelock): the executor waits and loads, the helper skips. Each case runs
in a fresh process (install patches Numba's dispatcher for the whole process) on a kernel
module and cache of its own."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

KERNEL = """
from numba import njit

@njit(cache=True)
def twice(x):
    return 2 * x
"""

CASE = """
import os, subprocess, sys, threading, time
HOLD = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR); "
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); print('held', flush=True); "
        "time.sleep(60)")
sys.path.insert(0, {kdir!r})
import numpy as np
from torchfl.kernels import compilelock, compiling
import kmod

compilelock.install({mode!r})
events = []
compiling.subscribe(lambda ev: events.append((ev.kind, ev.function)))
path = compilelock._state["dir"] / compilelock._name(kmod.twice, (kmod.numba_typeof(np.int64(1)),))
# another process holds the claim: an exclusive flock on the claim file, as compilelock takes it
holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "held"
{body}
holder.kill()
"""

WAIT = """
def release():      # another process compiles it into the cache, then lets go of the claim
    time.sleep(1.0)
    env = dict(os.environ, PYTHONPATH={kdir!r})
    subprocess.run([sys.executable, "-c", "import kmod; kmod.twice(3)"], env=env, check=True)
    path.unlink()
threading.Thread(target=release).start()
t0 = time.perf_counter()
assert kmod.twice(np.int64(3)) == 6
waited = time.perf_counter() - t0
stats = kmod.twice.stats
print("RESULT", round(waited, 2), sum(stats.cache_hits.values()), sum(stats.cache_misses.values()), events)
"""

SKIP = """
try:
    kmod.twice(np.int64(3))
except Exception as e:      # Numba may wrap it; the message names the claim
    print("RESULT", type(e).__name__, "being compiled by another process" in str(e))
else:
    print("RESULT compiled")
holder.kill()
holder.wait()               # its claim is now a dead process's: the kernel released the lock
assert kmod.twice(np.int64(3)) == 6
print("AFTER", sum(kmod.twice.stats.cache_misses.values()))
"""


# issue 39: a claim file left by a crashed process whose pid now names a live, unrelated
# process (pid reuse) hung every later run forever: _holder_dead looked at the pid only
REUSED = """
holder.kill()
holder.wait()
reused = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
path.write_text(str(reused.pid))    # the crashed holder's file, naming a live process now
t0 = time.perf_counter()
assert kmod.twice(np.int64(3)) == 6
print("RESULT", round(time.perf_counter() - t0, 2), sum(kmod.twice.stats.cache_misses.values()), path.exists())
reused.kill()
"""

# a live holder that never lets go (hung, stopped): waited for at most MAX_HOLD_S
HUNG = """
os.utime(path, (time.time() - compilelock.MAX_HOLD_S - 5,) * 2)
t0 = time.perf_counter()
assert kmod.twice(np.int64(3)) == 6
print("RESULT", round(time.perf_counter() - t0, 2), sum(kmod.twice.stats.cache_misses.values()))
"""


def _run(tmp_path, mode, body):
    kdir = tmp_path / "k"
    kdir.mkdir(parents=True)
    (kdir / "kmod.py").write_text(KERNEL + "\nfrom numba import typeof as numba_typeof\n")
    script = CASE.format(kdir=str(kdir), mode=mode, body=textwrap.dedent(body).format(kdir=str(kdir)))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith(("RESULT", "AFTER"))]


def test_wait_mode_waits_for_the_claim_then_loads_from_the_cache(tmp_path):
    (result,) = _run(tmp_path, "wait", WAIT)
    waited, hits, misses, events = result.split(" ", 3)
    assert float(waited) >= 0.9, result            # it waited for the other process
    assert (hits, misses) == ("1", "0"), result    # and loaded its compile instead of compiling
    # the wait is reported as the function's compile (progress displays see it)
    assert events == "[('start', 'kmod.twice'), ('end', 'kmod.twice')]", result


def test_skip_mode_gives_up_a_claimed_kernel_and_takes_over_a_dead_claim(tmp_path):
    result, after = _run(tmp_path, "skip", SKIP)
    assert result.endswith("True"), result
    assert after == "1", after      # compiled here once the holder was gone


def test_a_reused_pid_in_a_dead_claim_never_hangs_the_run(tmp_path):
    (result,) = _run(tmp_path, "wait", REUSED)
    waited, misses, left = result.split()
    assert float(waited) < 30, result   # compiled at once (hung forever before)
    assert misses == "1" and left == "False", result    # compiled here, the claim released


def test_a_claim_held_past_the_age_bound_is_compiled_beside(tmp_path):
    (result,) = _run(tmp_path, "wait", HUNG)
    waited, misses = result.split()
    assert float(waited) < 30 and misses == "1", result


# a claim that cannot be taken at all (a directory where the claim file goes): compiled unclaimed
UNCLAIMABLE = """
holder.kill()
holder.wait()
path.unlink()
path.mkdir()
assert kmod.twice(np.int64(3)) == 6
print("RESULT", sum(kmod.twice.stats.cache_misses.values()))
"""


def test_a_claim_that_cannot_be_taken_is_compiled_unclaimed(tmp_path):
    for mode in ("wait", "skip"):
        (result,) = _run(tmp_path / mode, mode, UNCLAIMABLE)
        assert result == "1", result


def test_helper_order_meets_the_executor_in_the_middle_then_compiles_frozen_paths():
    """precompile.order: each distinct call once, the one needed last first; calls with
    frozen inputs come first as the first call makes them (nothing frozen), and after all
    of those as later calls make them."""
    from torchfl.kernels.precompile import KernelCall, order

    def call(kernel, n, frozen=()):
        return KernelCall(kernel, f"{kernel}.impl", {"x": (n, 4)}, {"x": "float16"}, {"x": "AB"}, {}, "float16",
                          frozen)

    a, b, c = call("relu", 2), call("linear", 2, ("x",)), call("relu", 3)
    first, later = order([a, b, a, c, b], skip={c.ident})
    assert [(x.kernel, x.shapes["x"][0], x.frozen) for x in first] == [("linear", 2, ()), ("relu", 2, ())]
    assert [(x.kernel, x.frozen) for x in later] == [("linear", ("x",))]


def test_helper_count_follows_the_environment(monkeypatch):
    """Two helpers by default on 2+ CPUs (they split the calls through claims), none when
    turned off, a number when one is given."""
    from torchfl.kernels import precompile

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for value, expected in (("", 2), ("0", 0), ("off", 0), ("1", 1), ("3", 3)):
        monkeypatch.setenv(precompile.ENV, value)
        assert precompile.count() == expected, value
        assert precompile.enabled() == (expected > 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    monkeypatch.setenv(precompile.ENV, "")
    assert precompile.count() == 0


def test_helpers_are_handled_as_one_process():
    """precompile.Helpers: running while any runs, the first failure's status once all ended."""
    from torchfl.kernels.precompile import Helpers

    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    slow = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(1); sys.exit(3)"])
    helpers = Helpers([quick, slow], later=False)
    assert helpers.poll() is None
    assert helpers.wait(timeout=60) == 3 and helpers.poll() == 3
    helpers.terminate()     # nothing left to stop
