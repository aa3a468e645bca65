"""``torchfl plan explain``: output formats, and errors as one line with the choices."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('reg') / 'registry.db'}"
    out = subprocess.run([sys.executable, "-m", "torchfl.cli", "registry", "init", "--registry", url],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return url


def run(*args, registry=None):
    cmd = [sys.executable, "-m", "torchfl.cli", "plan", "explain", *args]
    if registry:
        cmd += ["--registry", registry]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_text_json_dot(registry):
    out = run("mlp", "--chip", "NPU-V3", "--precision", "float16", registry=registry)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.endswith("fallbacks to CPU") and " nodes on NPU-V3 in " in first
    out = run("mlp", "--chip", "NPU-V3", "--precision", "float16", "--format", "json", registry=registry)
    assert json.loads(out.stdout)["chip"] == "NPU-V3"
    out = run("mlp", "--chip", "NPU-V3", "--precision", "float16", "--format", "dot", registry=registry)
    assert out.stdout.startswith("digraph plan {")


def test_unknown_model_chip_format(registry):
    out = run("nope", "--chip", "NPU-V3", registry=registry)
    assert out.returncode == 1 and "resnet50" in out.stderr and "Traceback" not in out.stderr
    out = run("mlp", "--chip", "NOPE", "--precision", "float16", registry=registry)
    assert out.returncode == 1 and "NPU-V3" in out.stderr and "Traceback" not in out.stderr
    out = run("mlp", "--chip", "NPU-V3", "--format", "svg", registry=registry)
    assert out.returncode == 2 and "text" in out.stderr and "dot" in out.stderr


def test_hard_constraint_is_one_line(registry):
    out = run("mlp", "--chip", "NPU-V3", registry=registry)
    assert out.returncode == 1
    assert out.stderr.startswith("RuntimeError: NPU-V3 has no float32 compute unit")
    assert "--precision" in out.stderr and "Traceback" not in out.stderr


def test_user_factory(tmp_path, registry):
    f = tmp_path / "model.py"
    f.write_text("import torch\n"
                 "def make():\n"
                 "    return torch.nn.Sequential(torch.nn.Linear(8, 8)).eval(), (torch.randn(2, 8),)\n")
    out = run(f"{f}:make", "--chip", "TFL-X1", registry=registry)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("1 of 1 nodes on TFL-X1 in 1 kernels")
