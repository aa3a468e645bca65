"""Lazy mode's weights after a write through another tensor over their storage.

``p.data`` is a new tensor with a version counter of its own: ``p.data.copy_(w)`` or
``p.data.mul_(2)`` leaves ``p._version`` as it was, so lazy mode's cached static values (keyed
on identity, version and address) served the old weight, silently. The eager direct path
closed this hole with kept.py's write hooks; lazy mode's static inputs now register there too,
and a write bumps their storage's generation, which the key includes."""
import torch


def test_lazy_mode_sees_writes_through_data(fp32_dev):
    torch.manual_seed(0)
    m = torch.nn.Linear(64, 64).to(fp32_dev)
    x = torch.randn(8, 64)
    xd = x.to(fp32_dev)
    with torch.no_grad():
        with torch.npu.lazy():
            m(xd).cpu()
        new = torch.randn(64, 64)
        m.weight.data.copy_(new.to(fp32_dev))              # the adapter's C++ copy
        with torch.npu.lazy():
            got = m(xd).cpu()
        want = x @ new.t() + m.bias.cpu()
        # float32 on TFL-X1: one GEMM, the same products summed in another order
        assert (got - want).abs().max() < 1e-4, "the weight before copy_ was served"
        m.weight.data.mul_(2.0)                              # an in-place op through .data
        with torch.npu.lazy():
            got = m(xd).cpu()
        want = x @ (2 * new).t() + m.bias.cpu()
        assert (got - want).abs().max() < 1e-4, "the weight before mul_ was served"
