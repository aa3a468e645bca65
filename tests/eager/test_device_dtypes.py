"""float64 and complex npu tensors: the device holds their bytes; an op on them is planned
like any other: float64 under the precision policy (TORCHFL_PRECISION) or refused with the
HardConstraintError that names the dtype and the option, complex as host fallbacks whose
results come back as npu tensors."""
import pytest
import torch

from torchfl.planner.errors import HardConstraintError
from torchfl.runtime.eager.ops import clear_cache


def test_float64_without_policy_names_the_option(fp16_dev):
    clear_cache()
    x = torch.randn(4, 8, dtype=torch.float64).to(fp16_dev)
    with pytest.raises(HardConstraintError) as err:
        torch.relu(x)
    assert "torch.float64" in str(err.value) and "TORCHFL_PRECISION=float16" in str(err.value)


def test_float64_under_policy_stays_float64(fp16_dev, monkeypatch):
    monkeypatch.setenv("TORCHFL_PRECISION", "float16")
    clear_cache()
    x = torch.randn(4, 8, dtype=torch.float64)
    y = torch.relu(x.to(fp16_dev)) * 2
    assert y.device == torch.device(fp16_dev) and y.dtype == torch.float64
    torch.testing.assert_close(y.cpu(), torch.relu(x) * 2, rtol=2e-3, atol=2e-3)
    clear_cache()


def test_complex_runs_on_the_host_and_returns_npu(fp16_dev):
    clear_cache()
    c = torch.randn(5, dtype=torch.complex64)
    y = c.to(fp16_dev) * c.to(fp16_dev)
    assert y.device == torch.device(fp16_dev) and y.dtype == torch.complex64
    torch.testing.assert_close(y.cpu(), c * c)
