"""Operator-facing entry points under faults nobody had tried: a sweep command pointed at a
cluster that is not there recorded a sweep run (``note: sweep run 2 stopped with 0 of 14 units
recorded; finish it with --resume 2``) before it found out, so the registry kept a run that
never ran and the user was told to resume it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import descendants, kill_left_behind, still_alive

from torchfl.registry import Registry
from torchfl.registry.sweeps import Sweeps

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHFL_COMPILE_HELPERS="0",
               NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba")))
    env.pop("TORCHFL_REGISTRY_URL", None)
    return subprocess.run([sys.executable, "-m", "torchfl.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    u = f"sqlite:///{tmp_path_factory.mktemp('entry') / 'r.db'}"
    Registry(u).init(seed=True)
    return u


@pytest.mark.parametrize("command", [["plan", "compare", "mlp", "--chips", "NPU-V3,NPU-V2"], ["fidelity"]],
                         ids=["compare", "fidelity"])
def test_an_unreachable_cluster_records_no_sweep(url, command):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'torchfl[cluster]'")
    proc = _cli(*command, "--registry", url, "--cluster", "127.0.0.1:9")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: no Ray cluster at 127.0.0.1:9: cannot connect"), proc.stderr
    assert proc.stderr.count("\n") == 1 and "--resume" not in proc.stderr, proc.stderr
    assert Sweeps(Registry(url)).runs() == [], "a sweep run was recorded for a cluster that is not there"


def test_probe_checks_its_output_before_probing(tmp_path):
    # was: the whole probe ran, then a FileNotFoundError traceback (29 lines) and nothing written
    missing = tmp_path / "no-such-folder" / "host.hcd"
    proc = _cli("hcd", "probe", "--quick", "-o", str(missing), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: -o {missing}: the folder {missing.parent} does not exist; create it or choose " \
                          "another path\n"
    assert not missing.parent.exists()


def test_warmup_workers_end_with_a_killed_warmup(tmp_path, url):
    """kill -9 of ``torchfl kernels warmup`` left its spawn workers compiling (and the resource
    tracker) after the command was gone, as conformance's did before issue 39."""
    import signal

    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=str(tmp_path / "cold-cache"),
               TORCHFL_COMPILE_HELPERS="0")
    proc = subprocess.Popen([sys.executable, "-u", "-m", "torchfl.cli", "kernels", "warmup", "--registry", url,
                             "--model", "mlp", "--chip", "NPU-V3", "--chip", "NPU-V2", "--jobs", "2", "--force"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    children: set[int] = set()
    try:
        started, seen = 0, []
        while started < 2:
            line = proc.stdout.readline()
            assert line, "".join(seen)[-2000:]
            seen.append(line)
            started += "started:" in line
        children = descendants(proc.pid)
        assert len(children) >= 2, children
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        alive = still_alive(children, 30)
        assert not alive, f"still running after the warmup was killed: {sorted(alive)}"
    finally:
        kill_left_behind(proc, children)   # what a failed run left behind


def test_warmup_refuses_an_unknown_chip_before_starting_workers(url):
    # was: two workers started torch, planned, failed after ~15 s: "failed: mlp@NO-SUCH: ChoiceError ..."
    proc = _cli("kernels", "warmup", "--registry", url, "--model", "mlp", "--chip", "NPU-V3", "--chip", "NO-SUCH",
                timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: no chip named 'NO-SUCH'") and proc.stderr.count("\n") == 1, proc.stderr
    assert "warmup:" not in proc.stdout and "started:" not in proc.stdout, proc.stdout
