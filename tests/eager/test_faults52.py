"""Issue 52's eager cases 4, 13 and 14 (case 1, threads: test_threads.py).

* 4: ``t = torch.randn(750_000).half().to("npu:0"); t + t`` on a 4 MiB chip raised
  DeviceOOMError (1.43 MiB asked, 1.14 MiB free): a process's first structured op reached the
  device as its ``.out`` overload (the functional overloads were registered at the first op,
  after torch had dispatched it), so torch allocated an output before the op and the result
  was copied into it: three tensors held where two are needed. Now the functional overloads
  are registered at the device's first allocation.
* 13: ``half_npu + torch.tensor(2.0)`` raised HardConstraintError on a float16-only chip
  (NPU-V3): the 0-dim CPU float32 operand was planned as float32. torch's result is float16
  (``torch.result_type``: a 0-dim tensor of the same category does not widen it); the operand
  now takes that dtype, as torch's TensorIterator casts it.
* 14: out of device memory inside an op raised DeviceOOMError (or, refused at planning,
  MemoryLimitError), in a factory ``torch.OutOfMemoryError``; ``except torch.OutOfMemoryError``
  missed the first two. Now they are ``DeviceOutOfMemoryError`` (a DeviceOOMError: KernelError,
  MemoryError) and ``PlanOutOfMemoryError`` (a MemoryLimitError), both torch.OutOfMemoryError.

A 4 MiB chip (TFL-X1 / NPU-V3 with ``size_gb`` 4/1024, imported into a registry of the test's
own) runs in fresh processes: the first op of a process is what case 4 is about.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _four_mib_env(tmp_path) -> dict:
    """A registry holding the bundled chips and TFL-X1-4MIB / NPU-V3-4MIB (4 MiB of memory)."""
    from torchfl.hcd import load_hcd
    from torchfl.resources import bundled_hcds

    for name in ("TFL-X1", "NPU-V3"):
        hcd = next(h for h in map(load_hcd, bundled_hcds()) if h.chip.name == name)
        data = json.loads(hcd.canonical_json())
        data["memory"]["off_chip_memory"]["size_gb"] = 4 / 1024
        data["chip"]["name"] = f"{name}-4MIB"
        (tmp_path / f"{name}-4MIB.hcd").write_text(json.dumps(data))
    env = dict(os.environ, TORCHFL_REGISTRY_URL=f"sqlite:///{tmp_path / 'reg.db'}", PYTHONPATH=str(ROOT))
    for args in (["init"], ["import", str(tmp_path / "TFL-X1-4MIB.hcd"), str(tmp_path / "NPU-V3-4MIB.hcd")]):
        out = subprocess.run([sys.executable, "-m", "torchfl.cli", "registry", *args], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
    return env


def _fresh(env, code, devices):
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, TORCHFL_DEVICES=devices), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(line.split(" ", 1) for line in out.stdout.strip().splitlines() if " " in line)


FIRST_OP = """
import torch
t = torch.randn(750_000).half()
d = t.to("npu:0")
s = d + d                                   # the process's first op: DeviceOOMError before
print("equal", torch.equal(s.cpu(), t + t))
print("peak", torch.npu.max_memory_allocated(0))
print("nbytes", d.untyped_storage().nbytes())
"""


@pytest.mark.parametrize("chip", ["TFL-X1-4MIB", "NPU-V3-4MIB"])
def test_first_op_on_a_4_mib_chip_holds_two_tensors_not_three(tmp_path, chip):
    got = _fresh(_four_mib_env(tmp_path), FIRST_OP, chip)
    assert got["equal"] == "True", got
    assert int(got["peak"]) <= 2 * (int(got["nbytes"]) + 256), got      # t and t + t, aligned


CASTS = {
    "add": lambda h, z: h + z,
    "radd": lambda h, z: z + h,
    "mul": lambda h, z: h * z,
    "div": lambda h, z: h / z,
    "sub_": lambda h, z: h.clone().sub_(z),
    "where": lambda h, z: torch.where(h > 0, h, z),
    "maximum": lambda h, z: torch.maximum(h, z),
}


@pytest.mark.parametrize("name", list(CASTS))
@pytest.mark.parametrize("scalar", [torch.tensor(2.5), torch.tensor(-0.1, dtype=torch.float64)])
def test_half_tensor_with_a_0dim_cpu_float_gives_torch_dtype_and_values(fp16_dev, name, scalar):
    """NPU-V3 has no float32 unit: HardConstraintError before; torch's answer is float16."""
    h = torch.randn(6, 5).half()
    want = CASTS[name](h, scalar)
    got = CASTS[name](h.to(fp16_dev), scalar)
    assert got.device == torch.device(fp16_dev) and got.dtype == want.dtype == torch.float16
    torch.testing.assert_close(got.cpu(), want, rtol=1e-3, atol=1e-3)


def test_0dim_promotion_follows_torch_result_type(fp32_dev, fp16_dev):
    """Where torch widens, the result widens too (an integer tensor and a 0-dim float: float32),
    and a float32 tensor keeps float32 beside a 0-dim float64."""
    x = torch.randn(4)
    assert (x.to(fp32_dev) + torch.tensor(1.5, dtype=torch.float64)).dtype == torch.float32
    i = torch.arange(4, dtype=torch.int32)
    r = i.to(fp32_dev) * torch.tensor(0.5)
    assert r.dtype == torch.result_type(i, torch.tensor(0.5)) == torch.float32
    torch.testing.assert_close(r.cpu(), i * torch.tensor(0.5))
    z = torch.tensor(3.0)
    assert torch.where(torch.tensor(True), x.to(fp32_dev), z).dtype == torch.float32   # a 0-dim condition stays bool


OOM = """
import torch
from torchfl.kernels.errors import DeviceOOMError
from torchfl.planner.memory import MemoryLimitError
t = torch.randn(750_000).half().to("npu:0")
w = torch.randn(750_000).half().to("npu:0")           # live beside the op: the plan fits, the memory left not
before = torch.npu.memory_allocated(0)
for name, make in (("planned", lambda: torch.cat([t, t, t])),               # refused by its plan
                   ("op", lambda: t * 2),                                   # runs out in its kernel
                   ("factory", lambda: torch.empty(3 << 20, device="npu:0"))):
    try:
        make()
        print(name, "no error")
    except torch.OutOfMemoryError as exc:     # DeviceOOMError escaped this for an op before
        print(name, type(exc).__name__, isinstance(exc, MemoryError), "out of memory on" in str(exc),
              torch.npu.memory_allocated(0) == before)
try:
    t * 2
except DeviceOOMError as exc:                 # existing catches keep working
    print("old", type(exc).__name__, isinstance(exc, ValueError))
try:
    torch.cat([t, t, t])
except MemoryLimitError as exc:
    print("oldplan", type(exc).__name__, exc.memory.peak_bytes > 4 << 20)
"""


def test_out_of_memory_is_one_type_for_ops_and_factories(tmp_path):
    got = _fresh(_four_mib_env(tmp_path), OOM, "TFL-X1-4MIB")
    assert got["planned"] == "PlanOutOfMemoryError False False True", got
    assert got["op"] == "DeviceOutOfMemoryError True True True", got
    assert got["factory"].startswith("OutOfMemoryError") and got["factory"].endswith("True True"), got
    assert got["old"] == "DeviceOutOfMemoryError True", got
    assert got["oldplan"] == "PlanOutOfMemoryError True", got


def test_device_out_of_memory_error_pickles():
    """Worker processes (the conformance pool) send errors back pickled."""
    import pickle

    from torchfl.kernels.errors import DeviceOOMError, out_of_memory

    err = out_of_memory("out of memory on X: tried to allocate 1 B")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and isinstance(back, torch.OutOfMemoryError) and isinstance(back, DeviceOOMError)
    assert str(back) == str(err)
