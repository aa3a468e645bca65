"""Eager-device tests: real npu tensors in the emulated chips' device memory, real
one-op plans and Numba kernels. tests/conftest.py builds and loads the adapter once per
session and fixes the device list (TORCHFL_DEVICES=TFL-X1,NPU-V3,EDGE-C2 unless set).

Kernels compile into the one cache every entry point uses (README: `$NUMBA_CACHE_DIR`, else
the user cache directory), never a cache of the tests' own: in one `make test` run each
kernel then compiles once for every layer's tests (CI keeps no cache between runs, so a
second directory would only compile the same kernels twice)."""
import pytest


def _index_of(chip: str) -> int:
    import torch

    names = [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())]
    if chip not in names:
        pytest.fail(f"the eager tests need {chip} among the npu devices; TORCHFL_DEVICES gives {names}",
                    pytrace=False)
    return names.index(chip)


@pytest.fixture(scope="session")
def fp32_dev():
    """A chip with a float32 unit (TFL-X1): results comparable with CPU float32."""
    return f"npu:{_index_of('TFL-X1')}"


@pytest.fixture(scope="session")
def fp16_dev():
    """Another chip: float16 only, default layout NHCW, 256-byte alignment (NPU-V3)."""
    return f"npu:{_index_of('NPU-V3')}"


@pytest.fixture(scope="session")
def small_dev():
    """A chip with 1 GiB of off-chip memory (EDGE-C2)."""
    return f"npu:{_index_of('EDGE-C2')}"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("TORCHFL_STRICT", "TORCH_FL_DEBUG", "TORCHFL_PRECISION", "TORCHFL_LAZY"):
        monkeypatch.delenv(name, raising=False)
    yield
