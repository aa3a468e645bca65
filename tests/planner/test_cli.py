"""``torchfl plan explain``: output formats, and errors as one line with the choices.

In-process through click's runner (torch is imported once), on a real SQLite registry.
"""

import json

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    from torchfl.registry import Registry

    url = f"sqlite:///{tmp_path_factory.mktemp('reg') / 'registry.db'}"
    reg = Registry(url)
    reg.init(seed=True)
    reg.close()
    return url


def run(*args, registry=None):
    argv = ["plan", "explain", *args] + (["--registry", registry] if registry else [])
    return CliRunner().invoke(cli, argv)


def test_text_json_dot(registry):
    out = run("mlp", "--chip", "NPU-V3", "--precision", "float16", registry=registry)
    assert out.exit_code == 0, out.output
    first = out.stdout.splitlines()[0]
    assert first == "7 of 7 nodes on NPU-V3 in 4 kernels (3 fused groups), 0 layout conversions, 0 fallbacks to CPU"
    assert max(len(line) for line in out.stdout.splitlines()) <= 100      # CliRunner is a pipe: 100 columns
    # per-call cost apart from the run-once parameter casts; the legend explains the layouts used
    assert "Per call: predicted" in out.stdout and "Run once (static" in out.stdout
    # operands are named where their layouts differ; a 1-d bias has one layout and is not listed
    assert "bias:A" not in out.stdout and " AB " in out.stdout
    assert "Legend:" in out.stdout and "layout = letters" in out.stdout and "2buf" not in out.stdout
    out = run("mlp", "--chip", "NPU-V3", "--precision", "float16", "--format", "json", registry=registry)
    assert json.loads(out.stdout)["chip"] == "NPU-V3"
    out = run("mlp", "--chip", "NPU-V3", "--precision", "float16", "--format", "dot", registry=registry)
    assert out.stdout.startswith("digraph plan {") and "cluster_" in out.stdout
    assert "\\\\n" not in out.stdout and "\\n" in out.stdout  # DOT line breaks, not literal backslashes


def test_unknown_model_chip_format(registry):
    out = run("nope", "--chip", "NPU-V3", registry=registry)
    assert out.exit_code == 1 and "resnet50" in out.stderr and "Traceback" not in out.output
    out = run("mlp", "--chip", "NOPE", "--precision", "float16", registry=registry)
    assert out.exit_code == 1 and "NPU-V3" in out.stderr and "TFL-X1" in out.stderr
    out = run("mlp", "--chip", "NPU-V3", "--format", "svg", registry=registry)
    assert out.exit_code == 2 and "text" in out.stderr and "dot" in out.stderr


def test_hard_constraint_is_one_line(registry):
    out = run("mlp", "--chip", "NPU-V3", "--precision", "none", registry=registry)
    assert out.exit_code == 1
    assert out.stderr.startswith("RuntimeError: NPU-V3 has no float32 compute unit")
    assert "--precision" in out.stderr and "Traceback" not in out.output


def test_precision_auto_is_the_default(registry):
    """As in the what-if commands: float16 on a chip without an fp32 unit, none where there is one."""
    auto = run("mlp", "--chip", "NPU-V3", "--format", "json", registry=registry)
    f16 = run("mlp", "--chip", "NPU-V3", "--precision", "float16", "--format", "json", registry=registry)
    assert auto.exit_code == 0, auto.output
    assert json.loads(auto.stdout) == json.loads(f16.stdout)
    out = run("mlp", "--chip", "TFL-X1", "--format", "json", registry=registry)
    none = run("mlp", "--chip", "TFL-X1", "--precision", "none", "--format", "json", registry=registry)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == json.loads(none.stdout)


def test_user_factory(tmp_path, registry):
    f = tmp_path / "model.py"
    f.write_text("import torch\n"
                 "def make():\n"
                 "    return torch.nn.Sequential(torch.nn.Linear(8, 8)).eval(), (torch.randn(2, 8),)\n")
    out = run(f"{f}:make", "--chip", "TFL-X1", registry=registry)
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("1 of 1 nodes on TFL-X1 in 1 kernels")
    out = run(f"{f}:missing", "--chip", "TFL-X1", registry=registry)
    assert out.exit_code == 1 and "missing" in out.stderr


def test_options_that_do_not_apply_to_the_model_are_refused(tmp_path, registry):
    out = run("mlp", "--chip", "NPU-V3", "--precision", "float16", "--heads", "4", registry=registry)
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert out.stderr.strip() == "Error: --heads does not apply to mlp: it takes --batch; leave the option out"
    out = run("resnet18", "--chip", "NPU-V3", "--seq-len", "8", "--layers", "2", registry=registry)
    assert out.exit_code == 1 and "--seq-len, --layers do not apply to resnet18" in out.stderr
    f = tmp_path / "factory.py"
    f.write_text("import torch\n"
                 "def make(batch=2):\n"
                 "    return torch.nn.Sequential(torch.nn.Linear(8, 8)).eval(), (torch.randn(batch, 8),)\n")
    out = run(f"{f}:make", "--chip", "TFL-X1", "--seq-len", "16", registry=registry)
    assert out.exit_code == 1 and "--seq-len does not apply to" in out.stderr and "it takes --batch" in out.stderr
    out = run(f"{f}:make", "--chip", "TFL-X1", "--batch", "3", registry=registry)
    assert out.exit_code == 0, out.output
