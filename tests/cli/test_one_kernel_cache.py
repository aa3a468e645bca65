"""The tests use the kernel cache the README describes (issue 36): importing a test layer's
conftest leaves the cache where the CLI finds it (`torchfl kernels info`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("conftest", ["tests.eager.conftest", "tests.conformance.conftest"])
def test_tests_compile_into_the_cli_cache(conftest, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")          # a user cache nobody else touches
    env["PYTHONPATH"] = str(ROOT)
    probe = (f"import {conftest}\n"
             "from torchfl.kernels import jitcache\n"
             "print(jitcache.configure())\n")
    seen = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert seen.returncode == 0, seen.stderr
    info = subprocess.run([sys.executable, "-m", "torchfl.cli", "kernels", "info", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert info.returncode == 0, info.stderr
    cli_path = json.loads(info.stdout)["path"]
    assert seen.stdout.strip() == cli_path
    assert cli_path.startswith(str(tmp_path / "cache"))
