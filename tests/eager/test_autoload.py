"""The ``torch.backends`` entry point: ``import torch`` registers the npu device, cheaply,
and never fails, whatever state the registry or the toolchain is in.

The entry point is exercised for real: a throw-away distribution whose metadata declares
it (as torchfl's own pyproject does) is put on the path of a fresh interpreter, so torch's
autoloader finds and calls it at ``import torch``.
"""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = r"""
import sys, time
t = time.perf_counter()
import torch
print("import", round(time.perf_counter() - t, 2))
print("backend", torch._C._get_privateuse1_backend_name())
print("has_npu", hasattr(torch, "npu"))
print("heavy", sorted(m for m in ("numba", "sqlalchemy", "torchfl.planner", "torchfl.registry") if m in sys.modules))
print("available", torch.npu.is_available())
try:
    torch.empty(2, device="npu:0")
    print("first_use", "ok")
except Exception as exc:
    print("first_use", type(exc).__name__, str(exc).replace("\n", " "))
"""


def _probe_env(tmp_path, **env):
    """The environment of a fresh interpreter whose ``import torch`` autoloads torchfl."""
    site = tmp_path / "site"
    dist = site / "torchfl_autoload_probe-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torchfl-autoload-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[torch.backends]\ntorchfl = torchfl.runtime.eager:autoload\n")
    return dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{REPO}", TORCH_DEVICE_BACKEND_AUTOLOAD="1", **env)


def _run_probe(tmp_path, **env):
    full = _probe_env(tmp_path, **env)
    full.pop("TORCHFL_DEVICES", None)
    out = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())


def test_broken_registry_and_missing_compiler_do_not_break_import_torch(tmp_path):
    got = _run_probe(tmp_path,
                     TORCHFL_REGISTRY_URL=f"sqlite:///{tmp_path}/no/such/dir/registry.db",
                     TORCHFL_ADAPTER_DIR=str(tmp_path / "no-build-yet"),
                     CXX=str(tmp_path / "no-compiler"), PATH=str(tmp_path / "empty-bin"))
    assert got["backend"] == "npu" and got["has_npu"] == "True"
    assert got["heavy"] == "[]"                       # the entry point imports neither numba nor the registry
    assert got["available"] == "False"                # a registry that cannot open: no devices, no exception
    # the first use names what is missing
    assert got["first_use"].startswith("AdapterBuildError") and "C++ compiler" in got["first_use"], got


def test_autoload_with_a_working_setup_loads_the_cached_adapter(tmp_path):
    from torchfl.runtime.eager.build import build_dir

    got = _run_probe(tmp_path, TORCHFL_ADAPTER_DIR=str(build_dir().parent))
    assert got["backend"] == "npu" and got["available"] == "True"
    assert got["first_use"] == "ok"


COMPILE_PROBE = r"""
import torch
m = torch.nn.ReLU()
c = torch.compile(m, backend="torchfl", options={"chip": "TFL-X1"})
x = torch.randn(4, 8)
assert torch.equal(c(x), m(x))
print("accelerator", torch.accelerator.current_accelerator(), torch.accelerator.current_device_index())
print("adapter_built", any(__import__("pathlib").Path(__import__("os").environ["TORCHFL_ADAPTER_DIR"]).glob("*/*.so")))
"""


def test_torch_compile_works_before_the_adapter_is_built(tmp_path):
    """Regression: once ``npu`` is the accelerator, Dynamo asks it for the current stream at
    every trace; with no adapter built yet that raised inside ``torch.compile`` (any backend)."""
    env = _probe_env(tmp_path, TORCHFL_ADAPTER_DIR=str(tmp_path / "no-build-yet"))
    out = subprocess.run([sys.executable, "-c", COMPILE_PROBE], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
    assert got["accelerator"] == "npu 0", got
    assert got["adapter_built"] == "False"            # compiling a model never builds the eager adapter
