"""``--cluster`` / ``--resume`` / ``--sweeps`` from the command line, without a cluster: the
install hint when Ray is missing, a fast refusal of an address nothing listens on, and a local
conformance sweep whose driver is SIGKILLed, listed as partial and finished by ``--resume``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchfl.registry import Registry
from torchfl.registry.sweeps import Sweeps

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHFL_COMPILE_HELPERS="0",
               NUMBA_CACHE_DIR=os.environ.get("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba")))
    env.pop("TORCHFL_REGISTRY_URL", None)
    return env


def _cli(*args, pre: str = "pass", timeout=600) -> subprocess.CompletedProcess:
    code = f"import sys; {pre}; sys.argv = ['torchfl', *{list(args)!r}]; from torchfl.cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=_env(),
                          timeout=timeout)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    u = f"sqlite:///{tmp_path_factory.mktemp('sweeps') / 'r.db'}"
    Registry(u).init(seed=True)
    return u


def test_cluster_without_ray_prints_the_install_hint(url):
    proc = _cli("conformance", "--registry", url, "--chip", "TFL-X1", "--cluster", "auto",
                pre="sys.modules['ray'] = None")   # what `import ray` meets where Ray is not installed
    assert proc.returncode == 2
    assert proc.stderr == "error: --cluster needs Ray, which is not installed: pip install 'torchfl[cluster]'\n"
    for command in (["plan", "compare", "mlp"], ["plan", "impact", "--chip", "NPU-V3", "--from", "1.0.0", "--to",
                                                  "1.0.0"]):
        other = _cli(*command, "--registry", url, "--cluster", "auto", pre="sys.modules['ray'] = None")
        assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr
        assert "pip install 'torchfl[cluster]'" in other.stderr
    zoo = subprocess.run([sys.executable, "-c", "import sys, runpy; sys.modules['ray'] = None; sys.argv = "
                          "['bench_zoo.py', '--models', 'bert', '--chips', 'NPU-V3', '--cluster', 'auto']; "
                          "runpy.run_path('tools/bench_zoo.py', run_name='__main__')"],
                         capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=300)
    assert zoo.returncode == 2 and "pip install 'torchfl[cluster]'" in zoo.stderr, zoo.stderr


def test_an_address_nothing_listens_on_is_refused_at_once(url):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'torchfl[cluster]'")
    t0 = time.monotonic()
    proc = _cli("conformance", "--registry", url, "--chip", "TFL-X1", "--cluster", "127.0.0.1:9")
    assert proc.returncode == 2 and time.monotonic() - t0 < 60
    assert proc.stderr.startswith("error: no Ray cluster at 127.0.0.1:9: cannot connect") and proc.stderr.count("\n") == 1
    bad = _cli("conformance", "--registry", url, "--chip", "TFL-X1", "--cluster", "head-without-port")
    assert bad.returncode == 2 and "is not HOST:PORT" in bad.stderr


def test_a_registry_password_is_masked_in_errors():
    proc = _cli("conformance", "--registry", "postgresql://alice:hunter2@127.0.0.1:9/reg", "--sweeps")
    assert proc.returncode == 2 and "hunter2" not in proc.stderr and "alice:***@127.0.0.1:9" in proc.stderr


def test_a_local_sweep_whose_driver_died_is_partial_and_resume_finishes_it(url):
    sweep = ["--chip", "TFL-X1", "--ops", "neg,sigmoid", "--dtypes", "float32", "--samples", "1", "--edge", "0"]
    driver = subprocess.Popen([sys.executable, "-m", "torchfl.cli", "conformance", "--registry", url, *sweep,
                               "--jobs", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT, env=_env())
    sweeps = Sweeps(Registry(url))
    run, deadline = None, time.monotonic() + 300
    while driver.poll() is None and time.monotonic() < deadline:
        runs = sweeps.runs(kind="conformance")
        if runs and runs[0].done >= 1:
            run = runs[0]
            driver.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    driver.communicate(timeout=60)
    assert run is not None and driver.returncode == -signal.SIGKILL, "the driver finished before it could be killed"
    assert sweeps.get(run.id).status == "partial"
    listing = _cli("conformance", "--registry", url, "--sweeps").stdout
    assert f"partial: finish it with --resume {run.id}" in listing
    other = _cli("conformance", "--registry", url, "--resume", str(run.id), "--chip", "NPU-V3")
    assert other.returncode == 1 and f"sweep run {run.id} tests TFL-X1 only" in other.stderr
    missing = _cli("conformance", "--registry", url, "--resume", "999")
    assert missing.returncode == 1 and "no sweep run 999" in missing.stderr
    resumed = _cli("conformance", "--registry", url, "--resume", str(run.id))
    assert resumed.returncode == 0, resumed.stderr
    assert "(resumed)" in resumed.stderr and "2 verified" in resumed.stdout
    final = sweeps.get(run.id)
    assert final.status == "finished" and final.done == 2 == len(sweeps.results(run.id))
    assert f"recorded as run {final.outcome['conformance_run']}" in resumed.stdout
    again = _cli("conformance", "--registry", url, "--resume", str(run.id))
    assert again.returncode == 0 and "finished already" in again.stdout
