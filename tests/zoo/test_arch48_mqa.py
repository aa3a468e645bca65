"""core 1.18.0: scaled-dot-product attention with one key/value head and no ``enable_gqa``
(Falcon's multi-query attention: torch's math broadcasts the head) runs on the attention unit
(NPU-V3) and as core's decomposition (DSP-M4, no attention unit), strict, compiled and on the
eager device, against torch. Before, both fell back (issue 48). Tolerance: float16's, 2e-3
relative and absolute on outputs of magnitude ~1 (the inputs rounded to float16 first)."""
import pytest
import torch
import torch.nn.functional as F

from torchfl.planner import plan_module
from torchfl.runtime.executor import Executor


class MQA(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _inputs():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(s, generator=g).half().float() for s in ((2, 4, 16, 16), (2, 1, 16, 16), (2, 1, 16, 16)))


@pytest.mark.parametrize("chip", ["NPU-V3", "DSP-M4"])
def test_multi_query_attention_compiled(chip):
    xs = _inputs()
    plan = plan_module(MQA(), xs, chip=chip, precision="float16", strict=True)
    (got,) = Executor(plan).run(xs)
    torch.testing.assert_close(got.float(), MQA()(*xs), rtol=2e-3, atol=2e-3)


def test_multi_query_attention_on_the_eager_device(fp16_dev, monkeypatch):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    xs = _inputs()
    got = MQA()(*(x.half().to(fp16_dev) for x in xs)).cpu().float()
    torch.testing.assert_close(got, MQA()(*xs), rtol=2e-3, atol=2e-3)
