"""core 1.17.0's log1p decomposition (log(1 + x) corrected by Goldberg's x / ((1 + x) - 1)):
planned on the chip with no fallback (strict) in both modes, and against torch.log1p on values
where plain log(1 + x) is wrong (|x| below the dtype's epsilon), at -1, below it, -0, +-inf,
NaN and large x. Tolerance: float32 (TFL-X1) 4 float32 ulps relative (three roundings: log,
div, mul); float16 (NPU-V3) 2e-3 relative (each part rounds to float16, 2^-11), 1e-7 absolute
(float16's smallest subnormals). Mamba's ``log1p`` fell back before (issue 48)."""
import pytest
import torch

from torchfl.planner import plan_module
from torchfl.runtime.executor import Executor

X = torch.tensor([1e-8, -1e-8, 3e-5, -3e-5, 1e-3, 0.5, -0.5, -0.999, -1.0, -2.0, 0.0, -0.0, 2.0, 1e3, 1e30,
                  float("inf"), -float("inf"), float("nan")])


class Log1p(torch.nn.Module):
    def forward(self, x):
        return torch.log1p(x)


@pytest.mark.parametrize("chip,precision,rtol,atol", [("TFL-X1", None, 4 * 2 ** -23, 0.0),
                                                      ("NPU-V3", "float16", 2e-3, 1e-7)])
def test_log1p_planned_on_the_chip(chip, precision, rtol, atol):
    x = X if precision is None else X.half().float()
    plan = plan_module(Log1p(), (x,), chip=chip, precision=precision, strict=True)
    assert any(d.rule.endswith("log1p_corrected") for d in plan.decomposed)
    (got,) = Executor(plan).run((x,))
    ref = torch.log1p(x.double())
    if precision is not None:
        ref = ref.half().double()
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=atol, equal_nan=True)
    assert torch.equal(torch.signbit(got[11]), torch.tensor(True))          # log1p(-0.0) is -0.0


def test_log1p_on_the_eager_device(fp32_dev, monkeypatch):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    got = torch.log1p(X.to(fp32_dev)).cpu()
    torch.testing.assert_close(got.double(), torch.log1p(X.double()), rtol=4 * 2 ** -23, atol=0.0, equal_nan=True)
