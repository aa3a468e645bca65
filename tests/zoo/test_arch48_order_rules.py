"""The order family's rules (core 1.14.0: argmax, argmin, topk, sort.default, sort.stable) plan
on NPU-V3 in float16 with no fallback (strict) and match eager torch, compiled and on the eager
device: MoE routing (softmax over experts, top-2, tokens sorted by expert id) and CLIP's
pooling at the end-of-text token (argmax of the ids). Before core 1.14.0 each fell back to the
host (issue 48: CLIP's argmax, Mixtral/Qwen2-MoE/OLMoE's topk and sort)."""
import pytest
import torch

from torchfl.planner import plan_module
from torchfl.runtime.executor import Executor


class Router(torch.nn.Module):
    def __init__(self, experts=8, hidden=16):
        super().__init__()
        self.gate = torch.nn.Linear(hidden, experts, bias=False)

    def forward(self, x):                                   # x (tokens, hidden)
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, experts = torch.topk(probs, 2, dim=-1)
        order, token_pos = torch.sort(experts.view(-1), stable=True)
        return weights, experts, order, token_pos


class Pool(torch.nn.Module):
    def forward(self, hidden, ids):                         # CLIP: the state at the end-of-text id
        last = ids.argmax(dim=-1)
        first_min = hidden.argmin(dim=1)
        return hidden[torch.arange(hidden.shape[0]), last], first_min


def _check(got, ref):
    for g, r in zip(got, ref):
        if r.is_floating_point():
            torch.testing.assert_close(g.float(), r.float(), rtol=2e-3, atol=2e-3)
        else:
            assert torch.equal(g.long(), r.long())


def test_router_planned_whole_on_npu_v3():
    torch.manual_seed(0)
    m = Router().half().float()                             # weights exact in float16
    x = torch.randn(12, 16).half().float()
    plan = plan_module(m, (x,), chip="NPU-V3", precision="float16", strict=True)
    kernels = {s.kernel for s in plan.steps}
    assert {"topk", "sort"} <= kernels, kernels
    got = Executor(plan).run((x,))
    # the probabilities are float16 on the chip: compare picks made from those same values
    probs = torch.softmax(m.gate(x).half().float(), dim=-1).half().float()
    w, e = torch.topk(probs, 2, dim=-1)
    _check(got[:2], (w, e))
    o, t = torch.sort(got[1].long().view(-1), stable=True)
    _check(got[2:], (o, t))


def test_clip_pooling_planned_whole_on_npu_v3():
    torch.manual_seed(0)
    hidden = torch.randn(2, 7, 16)
    ids = torch.tensor([[5, 9, 49407, 0, 0, 0, 0], [5, 6, 7, 8, 9, 10, 49407]])
    plan = plan_module(Pool(), (hidden, ids), chip="NPU-V3", precision="float16", strict=True)
    assert "argmax" in {s.kernel for s in plan.steps}
    got = Executor(plan).run((hidden, ids))
    _check(got, Pool()(hidden.half().float(), ids))


def test_router_on_the_eager_device(fp16_dev, monkeypatch):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    monkeypatch.setenv("TORCHFL_PRECISION", "float16")     # the router's softmax in float32, as Mixtral's
    torch.manual_seed(0)
    m = Router().half()
    x = torch.randn(12, 16).half()
    ref = Router().half()
    ref.load_state_dict(m.state_dict())
    with torch.no_grad():
        got = m.to(fp16_dev)(x.to(fp16_dev))
        want = ref.float()(x.float())
    probs = torch.softmax(ref.gate(x.float()).half().float(), dim=-1)
    w, e = torch.topk(probs, 2, dim=-1)
    torch.testing.assert_close(got[0].cpu().float(), w, rtol=2e-3, atol=2e-3)
    assert torch.equal(got[1].cpu(), e) and torch.equal(got[1].cpu(), want[1])
    o, t = torch.sort(got[1].cpu().view(-1), stable=True)
    assert torch.equal(got[2].cpu(), o) and torch.equal(got[3].cpu(), t)


def test_argmax_on_the_eager_device(fp16_dev, monkeypatch):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    ids = torch.tensor([[5, 9, 49407, 0], [5, 49407, 7, 8]])
    assert torch.equal(ids.to(fp16_dev).argmax(dim=-1).cpu(), ids.argmax(dim=-1))
    x = torch.tensor([[1.0, float("nan"), 3.0], [2.0, 2.0, -1.0]]).half()
    assert torch.equal(x.to(fp16_dev).argmax(dim=1).cpu(), x.float().argmax(dim=1))
