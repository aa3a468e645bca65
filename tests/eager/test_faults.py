"""Issue 39's eager faults and issue 36's point 12.

* Device memory counts storages, not arguments: on a 1 GiB chip (EDGE-C2) ``t2 + t2`` with
  a 400 MiB ``t2`` and ``torch.cat([t, t])`` with 300 MiB were refused as out of memory
  (``MemoryLimitError ... arg0_1 (input, 400.00 MiB); arg1_1 (input, 400.00 MiB)``) though
  they fit; ``t2 * 2`` of the same size ran.
* Mixed npu/cpu operands follow torch's rule (as on CUDA) everywhere: a CPU tensor mixes
  with npu tensors only when it has zero dimensions (or is an index of an indexing op).
  Before: ``npu + cpu`` was accepted, ``npu.add_(cpu)`` refused.
* ``torch.accelerator.current_accelerator()`` answers ``npu`` in every process that has
  torchfl installed; ``TORCHFL_NPU=0`` is the documented way out (checked in fresh
  processes, since registration happens at ``import torch``).
"""
import os
import subprocess
import sys

import pytest
import torch

MIB = 2 ** 20


def test_one_tensor_twice_counts_once(small_dev):
    t2 = torch.ones(200 * MIB, dtype=torch.float16, device=small_dev)       # 400 MiB of 1 GiB
    s = t2 + t2                                                              # 800 MiB: fits
    assert s.shape == t2.shape and float(s[-1]) == 2.0
    del s
    y = t2 * t2
    assert float(y[0]) == 1.0
    del y, t2
    t = torch.ones(150 * MIB, dtype=torch.float16, device=small_dev)        # 300 MiB
    c = torch.cat([t, t])                                                    # 900 MiB: fits
    assert c.shape == (300 * MIB,) and float(c[-1]) == 1.0
    del c, t


def test_distinct_tensors_still_distinct(fp32_dev):
    """The alias pattern is part of the route: ``a + b`` after ``a + a`` reads b."""
    a, b = torch.ones(5, device=fp32_dev), torch.full((5,), 3.0, device=fp32_dev)
    assert torch.equal((a + a).cpu(), torch.full((5,), 2.0))
    assert torch.equal((a + b).cpu(), torch.full((5,), 4.0))
    assert torch.equal((b + b).cpu(), torch.full((5,), 6.0))


MIXED_REFUSED = {
    "npu + cpu": lambda n, c: n + c,
    "cpu + npu": lambda n, c: c + n,
    "npu.add_(cpu)": lambda n, c: n.add_(c),
    "cpu.add_(npu)": lambda n, c: c.add_(n),
    "cat": lambda n, c: torch.cat([n, c]),
    "mm": lambda n, c: n.view(1, 3) @ c.view(3, 1),
    "where": lambda n, c: torch.where(n > 0, n, c),
}


@pytest.mark.parametrize("name", list(MIXED_REFUSED))
def test_mixed_devices_refused_as_torch_does(fp32_dev, name):
    n, c = torch.randn(3).to(fp32_dev), torch.randn(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        MIXED_REFUSED[name](n, c)


def test_mixed_devices_allowed_as_torch_does(fp32_dev):
    n = torch.arange(6.0).to(fp32_dev)
    assert torch.equal((n + torch.tensor(1.0)).cpu(), torch.arange(6.0) + 1)       # a 0-dim CPU tensor
    assert torch.equal((torch.tensor(2.0) * n).cpu(), torch.arange(6.0) * 2)
    n.add_(torch.tensor(1.0))
    assert torch.equal(n.cpu(), torch.arange(6.0) + 1)
    assert torch.equal(n[torch.tensor([0, 2])].cpu(), torch.tensor([1.0, 3.0]))   # CPU indices


def _fresh(code, **env):
    full = dict(os.environ)
    full.update(env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


def test_accelerator_is_npu_by_default_and_torchfl_npu_0_is_the_way_out():
    code = "import torch; print(torch.accelerator.current_accelerator())"
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    assert _fresh(code, TORCHFL_NPU="", **env) == "npu"
    assert _fresh(code, TORCHFL_NPU="0", **env) == "None"
    assert _fresh(code, TORCHFL_NPU="1", TORCH_DEVICE_BACKEND_AUTOLOAD="0") == "None"


def test_compile_path_works_without_the_device():
    code = ("import torch\n"
            "m = torch.nn.Linear(8, 4)\n"
            "c = torch.compile(m, backend='torchfl', options={'chip': 'TFL-X1'})\n"
            "x = torch.randn(2, 8)\n"
            "print(torch.accelerator.current_accelerator(), torch.allclose(c(x), m(x), atol=1e-5))\n")
    assert _fresh(code, TORCHFL_NPU="0") == "None True"
