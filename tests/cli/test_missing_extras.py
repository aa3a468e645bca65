"""A wheel without an optional extra (issue 36): the command that needs it says how to install
it in one line, never a traceback. The extra is made absent the way Python itself spells it
(``sys.modules[name] = None``: its import raises ModuleNotFoundError)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _without(module: str, args: list[str], tmp_path):
    code = (f"import sys; sys.modules[{module!r}] = None; sys.argv = ['torchfl', *{args!r}]\n"
            "from torchfl.cli.main import main\nmain()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_")}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("args", [["plan", "explain", "bert-base", "--chip", "NPU-V3"],
                                  ["plan", "memory", "gpt2", "--chip", "NPU-V3"],
                                  ["plan", "compare", "bert-large", "--chips", "NPU-V3"]])
def test_models_extra_missing_gives_the_install_hint(args, tmp_path):
    res = _without("transformers", args, tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "pip install 'torchfl[models]'" in lines[0], res.stderr


def test_report_extra_missing_gives_the_install_hint(tmp_path):
    res = _without("matplotlib", ["plan", "report", "mlp", "--chip", "NPU-V3", "-o", "r.html"], tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "pip install 'torchfl[report]'" in res.stderr


def test_no_import_noise_from_the_cli(tmp_path):
    """transformers imports torchao, which logs 'Failed to load ..._C_mxfp8...' per CUDA
    extension, and torch logs pytree deprecation warnings: the CLI prints none of them."""
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_")}
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    env["PYTHONPATH"] = str(ROOT)
    # the noise, as a plain program that imports the same libraries gets it (torchfl leaves
    # everyone else's logging alone)
    plain = subprocess.run([sys.executable, "-c", "import torchfl, transformers; from transformers import BertModel"],
                           env=env, capture_output=True, text=True, timeout=600)
    if "Failed to load" not in plain.stderr and "_pytree" not in plain.stderr:
        pytest.skip("these libraries make no import noise in this environment")
    res = subprocess.run([sys.executable, "-m", "torchfl.cli", "plan", "memory", "bert-base", "--chip", "NPU-V3",
                          "--layers", "1", "--seq-len", "16", "--heads", "8"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "Failed to load" not in res.stderr and "_pytree" not in res.stderr, res.stderr
