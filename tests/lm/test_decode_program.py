"""One executor across the lengths of a bucket (runtime/resize.py): a decode builds one executor
per bucket, not one per token, and its results are bit-identical to a fresh executor's at every
length (static values made from a size, such as RoPE's positions, are made again)."""
import copy

import pytest
import torch

from tests.lm.families import model
from torchfl.runtime import backend
from torchfl.runtime.executor import Executor

X1 = {"chip": "TFL-X1"}


@pytest.fixture
def made(monkeypatch):
    """(CompiledGraphs, Executors) the backend makes in the test."""
    graphs, executors = [], []
    g_init, e_init = backend.CompiledGraph.__init__, Executor.__init__

    def g_spy(self, *a, **k):
        g_init(self, *a, **k)
        graphs.append(self)

    def e_spy(self, *a, **k):
        e_init(self, *a, **k)
        executors.append(self)
    monkeypatch.setattr(backend.CompiledGraph, "__init__", g_spy)
    monkeypatch.setattr(Executor, "__init__", e_spy)
    return graphs, executors


def test_a_32_token_decode_builds_one_executor_per_bucket(made):
    """32 new tokens after a 6-token prompt: prefill and the first decode step are planned per
    signature, then Dynamo's symbolic graph covers lengths 8..38, one bucket: one decision, one
    executor, >= 29 instances adopted by it; greedy tokens equal eager's."""
    graphs, executors = made
    m, _cfg = model("llama")
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = m.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    m.forward = torch.compile(m.forward, backend="torchfl", options=X1)
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    assert torch.equal(out, ref)
    dynamic = [g for g in graphs if g.lengths is not None]
    assert len(dynamic) == 1
    g = dynamic[0]
    assert g.lengths.decisions == 1 and g.lengths.instances >= 29
    mine = {id(e.executor) for e in g.entries.values()} | {id(x) for x in g._by_bucket.values()}
    assert len(mine) == 1
    # every executor made: prefill, first decode step, the bucket's one (no executor per token)
    assert len(executors) <= 3, len(executors)


def _decode(compiled, m, steps, seed):
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        pre = m(input_ids=ids, use_cache=True)
        cache = copy.deepcopy(pre.cache)
        token = pre.logits[:, -1:].argmax(-1)
        logits = []
        for _ in range(steps):
            out = compiled(input_ids=token, cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits.clone())
            token = out.logits[:, -1:].argmax(-1)
    return logits


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_adopted_lengths_are_bit_identical_to_a_fresh_executor(family, monkeypatch):
    """Every call of the symbolic graph, run by the bucket's executor, equals (torch.equal) a new
    Executor of the same instance plan on the same inputs: nothing of an earlier length (a
    bound problem, a folded arange of positions, a freed constant) leaks into a later one."""
    m, _cfg = model(family)
    compiled = torch.compile(m.forward, backend="torchfl", options=X1)
    checked = []
    call = backend.CompiledGraph.__call__

    def check(self, *args):
        out = call(self, *args)
        if self.lengths is not None:
            entry = self._entry(args)
            user = entry.user if entry.user is not None else range(len(args))
            fresh = Executor(entry.plan, log=False).run(tuple(args[i] for i in user))
            assert len(fresh) == len(out)
            for a, b in zip(out, fresh):
                if isinstance(a, torch.Tensor):
                    assert torch.equal(a, b)
            checked.append(entry.executor)
        return out
    monkeypatch.setattr(backend.CompiledGraph, "__call__", check)
    _decode(compiled, m, 7, seed=3)
    assert len(checked) >= 5 and len({id(e) for e in checked}) == 1


def test_an_earlier_length_runs_again_after_a_later_one(monkeypatch):
    """Two decodes from different prompts share the compiled graph: the second starts at a length
    the bucket's executor has left behind; it adopts that length's plan again (same logits as the
    first decode's, bit for bit, for the same prompt)."""
    m, _cfg = model("llama")
    compiled = torch.compile(m.forward, backend="torchfl", options=X1)
    first = _decode(compiled, m, 6, seed=5)
    _decode(compiled, m, 6, seed=6)
    again = _decode(compiled, m, 6, seed=5)
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_adopt_refuses_a_plan_of_another_structure():
    """adopt() takes only another instance of its plan (same steps, values, frees); anything
    else is refused with the executor unchanged, and the caller builds a new executor."""
    from torchfl import planner

    lin = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    other = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    x = torch.randn(2, 8)
    p1 = planner.plan_module(lin, (x,), chip="TFL-X1")
    p2 = planner.plan_module(other, (x,), chip="TFL-X1")
    ex = Executor(p1, log=False)
    want = ex.run((x,))[0]
    assert ex.adopt(p2) is False and ex.plan is p1
    assert torch.equal(ex.run((x,))[0], want)
    assert ex.adopt(p1) is True
