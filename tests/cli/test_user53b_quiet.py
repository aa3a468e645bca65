"""Issue 53, leftover of point 6: in a user's own program (``import torch; import torchfl``,
then a model that makes transformers import torchao), torchao's "Failed to load ..." lines and
torch's _pytree Enum deprecations were printed. ``import torchfl`` drops exactly those records;
any other torchao warning still shows, at the level Python configured."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import logging
import torch
import torchfl
import torchao                                   # what `import transformers` does when it is installed
m = torch.nn.ReLU()
c = torch.compile(m, backend="torchfl", options={"chip": "TFL-X1"})
x = torch.randn(4, 8)
assert torch.equal(c(x), m(x))
logging.getLogger("torchao").warning("another torchao warning")
logging.getLogger("torch.utils._pytree").warning("another pytree warning")
print(logging.getLogger("torchao").getEffectiveLevel())
"""


def _run(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_")}
    env.update(PYTHONPATH=str(ROOT), TORCHFL_REGISTRY_URL=f"sqlite:///{tmp_path / 'reg.db'}", **extra)
    return subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed")
def test_a_user_program_prints_no_torchao_import_noise(tmp_path):
    init = subprocess.run([sys.executable, "-m", "torchfl.cli", "registry", "init"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT),
                               "TORCHFL_REGISTRY_URL": f"sqlite:///{tmp_path / 'reg.db'}"}, timeout=300)
    assert init.returncode == 0, init.stderr
    res = _run(tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Failed to load" not in res.stderr and "is an Enum subclass" not in res.stderr, res.stderr[-3000:]
    assert "another torchao warning" in res.stderr and "another pytree warning" in res.stderr, res.stderr
    assert res.stdout.split()[-1] == "30"                 # WARNING: the program's logging left as it was
    loud = _run(tmp_path, TORCHFL_VERBOSE_IMPORTS="1")   # the escape hatch keeps them
    assert "Failed to load" in loud.stderr and "is an Enum subclass" in loud.stderr, loud.stderr[-3000:]
