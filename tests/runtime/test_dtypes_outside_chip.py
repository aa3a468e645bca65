"""Dtypes no chip stores (float64, complex) and ops whose capture is unusual (linalg.inv's
effect token, data-dependent shapes), through torch.compile(backend="torchfl") against eager.

float64 is planned under the precision policy like float32 (link casts at upload and
download; outputs come back float64) or refused before execution with a HardConstraintError
naming the dtype and the option; complex values live on the host and run as explicit host
fallbacks in eager's dtypes; strict mode refuses those fallbacks by name.
"""
import pytest
import torch

from torchfl.planner.errors import HardConstraintError, StrictFallbackError

FP16 = (2e-3, 2e-3)       # tests/kernels/tolerances.py: float16


def compiled(fn, **options):
    return torch.compile(fn, backend="torchfl", options={"chip": "NPU-V3", "precision": "float16", **options})


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 6)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


def test_float64_model_under_policy_returns_float64():
    torch.manual_seed(0)
    m = Small().double()
    x = torch.randn(4, 8, dtype=torch.float64)
    y = compiled(m, strict=True)(x)           # strict: every op on the chip, no fallback
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, m(x), rtol=FP16[0] * 4, atol=FP16[1] * 4)


def test_float64_plan_casts_on_the_link():
    from torchfl import planner
    from torchfl.runtime.executor import Executor

    m = Small().double()
    x = torch.randn(3, 8, dtype=torch.float64)
    plan = planner.plan_module(m, (x,), chip="NPU-V3", precision="float16")
    assert not plan.fallbacks
    assert any(c.from_dtype == "float64" and c.to_dtype == "float16" for c in plan.casts)
    assert any(c.from_dtype == "float16" and c.to_dtype == "float64" for c in plan.casts)
    on_chip = {b.name for b in plan.memory.buffers}
    assert not on_chip & {p.name for p in plan.inputs}   # float64 input and weights stay on the host
    (y,) = Executor(plan, log=False).run((x,))
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, m(x), rtol=FP16[0] * 4, atol=FP16[1] * 4)
    from torchfl.runtime.analyze import analyze

    links = [s for s in analyze(plan, (x,)).steps if s.kind == "cast"]   # priced as what the link moves
    assert links and all(s.bytes_match for s in links)


@pytest.mark.parametrize("chip,fix", [("NPU-V3", "precision='float16'"), ("TFL-X1", "precision='float32'")])
def test_float64_without_policy_is_refused_before_running(chip, fix):
    x = torch.randn(4, 8, dtype=torch.float64)
    with pytest.raises(HardConstraintError) as err:
        compiled(lambda t: t * 2, chip=chip, precision=None)(x)
    msg = str(err.value)
    assert "torch.float64" in msg and fix in msg and "tensor.supported_dtypes" in msg
    assert err.value.field == "tensor.supported_dtypes"


def test_float64_precision_float32_on_an_fp32_chip():
    x = torch.randn(4, 8, dtype=torch.float64)
    y = compiled(lambda t: torch.softmax(t, -1) + 1, chip="TFL-X1", precision="float32", strict=True)(x)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, torch.softmax(x, -1) + 1, rtol=1e-5, atol=1e-6)


def test_complex_runs_as_host_fallbacks():
    x = torch.randn(4, 8, dtype=torch.complex64)
    fn = lambda t: (t * t).abs() + 1   # noqa: E731
    y = compiled(fn)(x)
    ref = fn(x)
    assert y.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=FP16[0], atol=FP16[1] * 8)
    torch._dynamo.reset()
    with pytest.raises(StrictFallbackError) as err:
        compiled(fn, strict=True)(x)
    assert "complex64" in str(err.value)


def test_fft_fallback_computes_in_float32_not_float16():
    x = torch.randn(4, 16)
    fn = lambda t: torch.fft.fft(t).abs()   # noqa: E731
    y = compiled(fn)(x)
    assert y.dtype == torch.float32
    # the input passes through the policy's float16, then the host computes in float32
    ref = fn(x.half().float())
    torch.testing.assert_close(y, ref, rtol=FP16[0], atol=FP16[1] * 8)


def test_linalg_inv_falls_back_and_strict_names_it():
    x = torch.randn(3, 4, 4) + 4 * torch.eye(4)
    y = compiled(torch.linalg.inv)(x)
    torch.testing.assert_close(y, torch.linalg.inv(x.half().float()), rtol=5e-3, atol=5e-3)
    torch._dynamo.reset()
    with pytest.raises(StrictFallbackError) as err:
        compiled(torch.linalg.inv, strict=True)(x)
    assert "linalg_inv_ex" in str(err.value)


@pytest.mark.parametrize("fn", [lambda t: t[t > 0].sum(), lambda t: torch.nonzero(t > 0).float().sum(),
                                lambda t: torch.unique(t.round())],
                         ids=["mask-index", "nonzero", "unique"])
def test_data_dependent_shapes_run(fn):
    x = torch.randn(4, 8)
    y = compiled(fn, chip="TFL-X1", precision=None)(x)
    torch.testing.assert_close(y, fn(x))


class _Nonzero(torch.nn.Module):
    def forward(self, t):
        return torch.nonzero(t > 0).float().sum()


def test_plan_module_names_a_data_dependent_shape():
    from torchfl import planner
    from torchfl.planner.capture import CaptureError

    with pytest.raises(CaptureError) as err:
        planner.plan_module(_Nonzero(), (torch.randn(4, 8),), chip="TFL-X1")
    assert "nonzero" in str(err.value) and "data-dependent output shape" in str(err.value)
    assert 'backend="torchfl"' in str(err.value)


def test_plan_module_runs_linalg_inv_as_fallbacks():
    from torchfl import planner
    from torchfl.runtime.executor import Executor

    class Inv(torch.nn.Module):
        def forward(self, t):
            return torch.linalg.inv(t)

    x = torch.randn(2, 3, 3) + 3 * torch.eye(3)
    plan = planner.plan_module(Inv(), (x,), chip="TFL-X1")
    assert {f.op for f in plan.fallbacks} == {"aten.linalg_inv_ex.default", "aten._linalg_check_errors.default"}
    (y,) = Executor(plan, log=False).run((x,))
    torch.testing.assert_close(y, torch.linalg.inv(x), rtol=1e-4, atol=1e-5)


def test_softmax_of_a_nan_row_is_nan_like_eager():
    """The issue's case end to end: eager returns NaN for a row holding NaN (and for a row
    holding +inf); the chip's softmax used to return finite probabilities."""
    x = torch.randn(4, 6)
    x[1, 2], x[2, 0] = float("nan"), float("inf")
    y = compiled(lambda t: torch.softmax(t, -1), strict=True)(x)
    ref = torch.softmax(x, -1)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    torch.testing.assert_close(y, ref, rtol=FP16[0], atol=FP16[1], equal_nan=True)
