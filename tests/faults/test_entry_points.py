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
