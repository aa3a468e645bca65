"""What makes ``conformance --samples all`` affordable (issue 38): a joint graph's per-case
function is cheap for Dynamo to trace, and gives exactly the call eager torch makes."""
from __future__ import annotations

import pytest
import torch

from torchfl.conformance.cases import Case, opinfo_cases

OPINFOS = ("cat", "nn.functional.max_pool2d", "nn.functional.conv2d", "where", "nn.functional.pad.constant",
           "nn.functional.embedding", "nn.functional.group_norm", "addmm", "to")


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        return
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    assert a == b


@pytest.mark.parametrize("name", OPINFOS)
def test_the_case_function_makes_the_eager_call_without_pytree(name, monkeypatch):
    """Dynamo traced ``tree_unflatten`` for every case of a joint graph (8x the op's own trace):
    the function rebuilds its arguments from a template instead, with the same result."""
    import torch.utils._pytree as pytree

    cases = opinfo_cases(name, torch.float32, samples=24, edge_from=1)
    built = [c.as_function() for c in cases]
    eager = []
    for case in cases:
        try:
            with torch.no_grad():
                eager.append(case.call())
        except Exception as exc:  # noqa: BLE001 - eager torch rejects some variants (an empty embedding)
            eager.append(exc)

    def refuse(*_a, **_k):
        raise AssertionError("tree_unflatten called by a case function")

    monkeypatch.setattr(pytree, "tree_unflatten", refuse)
    for case, (fn, leaves), want in zip(cases, built, eager):
        assert [id(t) for t in leaves] == [id(t) for t in case.leaves()]
        if isinstance(want, Exception):
            with pytest.raises(type(want)):
                fn(*leaves)
            continue
        with torch.no_grad():
            _same(fn(*leaves), want)


def test_a_tensor_nested_deeper_keeps_the_pytree_path():
    a, b = torch.randn(3), torch.randn(3)
    case = Case("custom", 0, "opinfo", lambda xs, scale: xs["v"][0] * scale + xs["v"][1], ({"v": [a, b]}, 2.0))
    fn, leaves = case.as_function()
    assert leaves[0] is a and leaves[1] is b
    x, y = torch.ones(3), torch.zeros(3)
    _same(fn(x, y), x * 2.0 + y)
