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


def test_a_case_refused_on_its_inputs_runs_alone_and_the_rest_stays_one_graph(seeded_url, monkeypatch):
    """EDGE-C2 (NCWH only) refuses a channels-last input: the joint graph was split in halves
    down to that case (2 log2(n) more traces and captures); now it runs alone at once, the
    other cases stay one graph, and each chip's outcomes are those it gets alone."""
    import torchfl.planner.capture as capture
    from torchfl.conformance.execute import Chip, prepare, run_cases_on

    calls = []
    real = capture.capture_dynamo
    monkeypatch.setattr(capture, "capture_dynamo", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    cases = [Case("add", i, "opinfo", torch.add, (torch.randn(1, 3, 4, 4, dtype=torch.float16),
                                                   torch.randn(1, 3, 4, 4, dtype=torch.float16))) for i in range(16)]
    cl = cases[5].args[0].contiguous(memory_format=torch.channels_last)
    cases[5] = Case("add", 5, "channels_last", torch.add, (cl, cases[5].args[1]))
    chips = {"NPU-V3": Chip(("aten.add.Tensor",)), "EDGE-C2": Chip(("aten.add.Tensor",))}
    together = run_cases_on(cases, chips, seeded_url)
    assert len(calls) == 2, calls     # the 16 for NPU-V3, the other 15 for EDGE-C2; the refused one before capture
    assert [o.status for o in together["NPU-V3"]] == ["pass"] * 16
    assert [o.status for o in together["EDGE-C2"]] == ["pass"] * 5 + ["refused"] + ["pass"] * 10
    assert "channels_last" in together["EDGE-C2"][5].reason
    for chip, c in chips.items():
        alone = run_cases_on(cases, {chip: c}, seeded_url)[chip]
        assert [o.as_dict() for o in alone] == [o.as_dict() for o in together[chip]]
    assert prepare(cases[5]).layout == "channels_last"


@pytest.mark.parametrize("name,joint", [("nn.functional.max_pool2d", True), ("nn.functional.conv2d", True),
                                        ("add", True), ("cat", True), ("to", False)])
def test_one_capture_labels_many_cases_as_one_capture_each(name, joint, monkeypatch):
    """The overloads a refused case is labelled with come from one capture of all the refused
    cases (a capture each was 40% of a max_pool2d slice's CPU): the same labels as one each."""
    import torchfl.planner.capture as capture
    from torchfl.conformance.execute import graph_ops, graph_ops_many, prepare

    prepared = [p for p in (prepare(c) for c in opinfo_cases(name, torch.float16, samples=10, edge_from=1))
                if not p.skip]
    assert len(prepared) >= 2
    want = [graph_ops(p.case) for p in prepared]
    calls = []
    real = capture.capture_module
    monkeypatch.setattr(capture, "capture_module", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert graph_ops_many(prepared) == want
    # ``to`` returns some inputs unchanged (no op behind the output): one capture each, same labels
    assert (len(calls) == 1) == joint, f"{len(calls)} captures for {len(prepared)} cases"


def test_the_cases_whose_ops_a_chip_refused_run_alone_and_the_rest_stays_one_graph(seeded_url, monkeypatch):
    """max_pool2d's 3-D samples are refused by every chip (rule guard ``self.rank == 4``): a
    joint graph of them was split in halves down to each one (2n-1 traces and captures); the
    strict refusal names the refused nodes, whose cases now run alone at once."""
    import torchfl.planner.capture as capture
    from torchfl.conformance.execute import Chip, run_cases_on

    cases = opinfo_cases("nn.functional.max_pool2d", torch.float16, samples=None, edge_from=0)[1148:1156]
    assert [c.args[0].dim() for c in cases] == [4] * 4 + [3] * 4
    calls = []
    real = capture.capture_dynamo
    monkeypatch.setattr(capture, "capture_dynamo", lambda *a, **k: calls.append(1) or real(*a, **k))
    targets = ("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default")
    chips = {"NPU-V3": Chip(targets), "TFL-X1": Chip(targets)}
    together = run_cases_on(cases, chips, seeded_url, first=1148)
    assert len(calls) == 6, calls     # the 8, each 3-D one alone, the four 4-D ones (halves: 9)
    for chip in chips:
        assert [o.status for o in together[chip]] == ["pass"] * 4 + ["refused"] * 4
        assert all("self.rank == 4" in o.reason and o.ops for o in together[chip][4:])
    alone = run_cases_on(cases, {"TFL-X1": chips["TFL-X1"]}, seeded_url, first=1148)["TFL-X1"]
    assert [o.as_dict() for o in alone] == [o.as_dict() for o in together["TFL-X1"]]
