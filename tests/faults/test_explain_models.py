"""``torchfl plan explain`` on bad user models (the what-if commands share the loader): a file
that raises on import, a missing factory, a factory that raises or returns no module, inputs of
the wrong shape or dtype, a forward that raises. Before: tracebacks of 34-278 lines, or (wrong
dtype: a Linear given int64) a plan with exit 0 that could never run. Now: one line on stderr,
``Error: ...`` naming what, where and the fix, exit 1, nothing written: no registry created, no
``__pycache__`` beside the model file, no route run recorded."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli

MODELS = '''
import torch

def raises():
    raise RuntimeError("factory broke")

def notmodule():
    return 3, (torch.randn(2, 4),)

def wrong_shape():
    return torch.nn.Linear(4, 8), (torch.randn(2, 5),)

def wrong_dtype():
    return torch.nn.Linear(4, 8), (torch.randint(0, 3, (2, 4)),)

class Broken(torch.nn.Module):
    def forward(self, x):
        raise ValueError("forward broke")

def forward_raises():
    return Broken(), (torch.randn(2, 4),)

class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(4)

    def forward(self, x):
        return torch.nn.functional.dropout(self.bn(x), 0.5, self.training)

def train_mode():
    return Counting().train(), (torch.randn(8, 4),)

def exits():
    import sys
    sys.exit(3)

class DataDependent(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x

def data_dependent():
    return DataDependent(), (torch.randn(2, 4),)

class NonZero(torch.nn.Module):
    def forward(self, x):
        return torch.nonzero(x)

def nonzero():
    return NonZero(), (torch.randn(2, 4),)
'''

CASES = {
    "bad_import.py:make": ("could not load", "bad_import.py", "nonexistent_module_xyz"),
    "models.py:nosuch": ("has no callable 'nosuch'", "def nosuch()"),
    "models.py:raises": ("the model factory", "raised RuntimeError: factory broke", "models.py:5)"),
    "models.py:notmodule": ("returned int as the module", "torch.nn.Module"),
    "models.py:wrong_shape": ("forward fails on its example inputs ((2, 5) float32)", "RuntimeError"),
    "models.py:wrong_dtype": ("forward fails on its example inputs ((2, 4) int64)", "same dtype"),
    "models.py:forward_raises": ("forward fails on its example inputs", "ValueError: forward broke"),
    # exit 3 and no word before; a CaptureError traceback (42 and 229 lines) for the two after
    "models.py:exits": ("called sys.exit(3)", "models.py:"),
    "models.py:data_dependent": ("depends on tensor values", "DataDependentOutputException", "torch.compile"),
    "models.py:nonzero": ("depends on tensor values", "DynamicOutputShapeException: aten.nonzero.default"),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain-models")
    (root / "bad_import.py").write_text("import nonexistent_module_xyz\n")
    (root / "models.py").write_text(MODELS)
    return root


@pytest.mark.parametrize("spec", sorted(CASES))
@pytest.mark.parametrize("extra", [[], ["--analyze", "--record"]], ids=["plain", "analyze-record"])
def test_bad_model_is_one_line(models, tmp_path, spec, extra):
    registry = tmp_path / "registry.sqlite3"
    before = sorted(p.name for p in models.iterdir())
    result = CliRunner().invoke(cli, ["plan", "explain", str(models / spec), "--chip", "NPU-V3",
                                      "--registry", f"sqlite:///{registry}", *extra])
    out = result.output
    assert result.exit_code == 1, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), out
    assert "Traceback" not in out
    for word in CASES[spec]:
        assert word in lines[0], (word, lines[0])
    assert not registry.exists()                               # nothing written
    assert sorted(p.name for p in models.iterdir()) == before  # no __pycache__, nothing left beside the model


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    from torchfl.registry import Registry

    url = f"sqlite:///{tmp_path_factory.mktemp('explain-registry') / 'registry.sqlite3'}"
    Registry(url).init(seed=True)
    return url


@pytest.mark.parametrize("command", [["plan", "memory"], ["plan", "compare", "--chips", "NPU-V3"]])
def test_what_if_commands_refuse_the_wrong_dtype(models, seeded, command):
    # their fake-tensor check passed a Linear given int64 inputs: a plan that could never run
    args = [*command, str(models / "models.py:wrong_dtype"), "--registry", seeded]
    if command[1] == "memory":
        args += ["--chip", "NPU-V3"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "same dtype" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_check_run_leaves_the_model_as_it_was(models):
    # the real forward that checks dtypes must not move a train-mode batch-norm's statistics or the RNG
    import torch

    from torchfl.cli.usermodel import load_user_model

    module, inputs = load_user_model(str(models / "models.py:train_mode"))
    state = {k: v.clone() for k, v in module.state_dict().items()}
    rng = torch.random.get_rng_state()
    from torchfl.cli.usermodel import run_error

    assert run_error(module, inputs) is None
    assert all(torch.equal(state[k], v) for k, v in module.state_dict().items())
    assert torch.equal(rng, torch.random.get_rng_state())
