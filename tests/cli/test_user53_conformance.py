"""Issue 53 point 4: without ``expecttest`` (torch's OpInfo database imports it; the plain
install does not have it) ``torchfl conformance`` refuses in one line with the install hint,
exits non-zero and records nothing, instead of "0 cases (+1 skipped), unverified", exit 0."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _torchfl(args, tmp_path, without=None):
    hide = f"import sys; sys.modules[{without!r}] = None\n" if without else ""
    code = hide + f"import sys; sys.argv = ['torchfl', *{args!r}]\nfrom torchfl.cli.main import main\nmain()\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_")}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)


def test_conformance_without_expecttest_refuses_and_records_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    assert _torchfl(["registry", "init", "--registry", url], tmp_path).returncode == 0
    res = _torchfl(["conformance", "--chip", "NPU-V3", "--ops", "relu", "--registry", url], tmp_path,
                   without="expecttest")
    assert res.returncode == 1, res.stdout + res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "expecttest" in lines[0] and "pip install 'torchfl[conformance]'" in lines[0], \
        res.stderr
    assert "Traceback" not in res.stderr and "unverified" not in res.stdout
    from torchfl.registry import Registry

    assert Registry(url).conformance_runs() == []
