"""Issue 48's state-space model: a tiny Mamba (transformers' MambaForCausalLM, hidden 64, state 8,
2 layers, vocab 128, random weights, nothing downloaded; tools/bench_zoo.SSM) whole on NPU-V3
float16 in both modes, against eager torch float32 within the zoo's float16 tolerance
(tools/bench_zoo.TOLERANCE: 2e-2 of the largest output magnitude).

Before (core 1.23.0): compiled, 0 fallbacks but the scan was transformers' associative scan
unrolled by Dynamo (299 nodes for the model at length 16, a tree of slices, vmapped
multiply-adds); on ``npu`` the Python loop over time ran step by step and its 16-way ``stack``
fell back to the host (``aten::cat``: the concat kernel joins 2 to 8 tensors), 2 host steps.
Now transformers' ``mamba_selective_scan`` reaches ``torch.ops.torchfl.selective_scan``
(torchfl/kernels/ssm/hf_route) and the ``selective_scan`` kernel (kernels/ssm, core 1.24.0) in
both modes: one kernel a layer, the state on chip; the causal conv1d before it is conv2d's
depthwise kernel (kernels/conv1d). FalconMamba (its own copy of the scan function, B, C and dt
RMS-normed first) is routed the same way."""
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import bench_zoo  # noqa: E402


@pytest.mark.parametrize("name", list(bench_zoo.SSM))
def test_mamba_compiled_on_npu_v3(name):
    from torchfl.runtime.backend import recording  # noqa: F401  (the backend: routes captures, see kernels/ssm/hf_route)

    r = bench_zoo.run_one(name, "NPU-V3", "float16", runs=1)
    assert "error_message" not in r, r
    assert r["within_tolerance"], (r["error"], r["tolerance"])
    assert r["fallbacks"] == 0, r["fallback_reasons"]
    assert r["nodes"] < 140, r["nodes"]          # Mamba: 313 with the unrolled associative scan


def test_mamba_plan_prices_the_scan():
    """The plan's step for each layer is the selective_scan kernel, priced by its tiling (explain)."""
    import torch
    import transformers as tr

    from torchfl.runtime.backend import recording

    torch.manual_seed(0)
    model = tr.MambaForCausalLM(tr.MambaConfig(vocab_size=128, hidden_size=64, state_size=8,
                                               num_hidden_layers=2, use_cache=False)).eval()
    ids = torch.randint(3, 128, (2, 16))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="torchfl", options={"chip": "NPU-V3", "precision": "float16"})
    with torch.no_grad(), recording() as r:
        compiled(ids)
    (plan,) = [p for _cg, p, _r in r.entries]
    scans = [s for s in plan.steps if s.kernel == "selective_scan"]
    assert len(scans) == 2, [s.kernel for s in plan.steps]
    for s in scans:
        assert s.predicted_time_s > 0 and "state 128x8 fp32 held on chip" in s.tile["notes"], s.tile
    assert "selective_scan" in plan.explain()


def test_mamba_planned_by_the_planners_capture():
    """``plan_module`` (torch.export, what ``torchfl plan`` uses) routes the scan too: strict on
    NPU-V3 float16, executed, the logits within the zoo's tolerance. Before: the recurrent loop
    unrolled (601 steps) and its 16-way cat on the host (2 fallbacks)."""
    import torch
    import transformers as tr

    from torchfl.planner import plan_module
    from torchfl.runtime.executor import Executor

    torch.manual_seed(0)
    model = tr.MambaForCausalLM(tr.MambaConfig(vocab_size=128, hidden_size=64, state_size=8,
                                               num_hidden_layers=2, use_cache=False)).eval()
    ids = torch.randint(3, 128, (2, 16))
    plan = plan_module(model, (ids,), chip="NPU-V3", precision="float16", strict=True)
    assert [s.kernel for s in plan.steps].count("selective_scan") == 2 and len(plan.steps) < 120
    with torch.no_grad():
        ref = model(ids).logits
    got = Executor(plan).run((ids,))[0]
    assert (got.float() - ref).abs().max().item() <= bench_zoo.TOLERANCE["float16"] * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("name", list(bench_zoo.SSM))
def test_mamba_on_the_eager_device(fp16_dev, monkeypatch, name):
    import torch

    from torchfl.runtime.eager import ops

    monkeypatch.setenv("TORCHFL_PRECISION", "float16")
    index = [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())].index("NPU-V3")
    before = ops.ROUTES.get(("torchfl::selective_scan", "chip"), 0)
    r = bench_zoo.run_one_eager(name, "NPU-V3", index, "float16", runs=0)
    assert "error_message" not in r, r
    assert r["within_tolerance"], (r["error"], r["tolerance"])
    assert r["fallbacks"] == 0, r["fallback_ops"]
    assert ops.ROUTES.get(("torchfl::selective_scan", "chip"), 0) - before == 2     # one per layer


def test_cpu_eager_keeps_transformers_function():
    """CPU tensors outside a torchfl compile still run transformers' own loop (the swap is scoped)."""
    import torch
    from transformers.models.mamba import modeling_mamba as mm

    fn = mm.mamba_selective_scan
    assert hasattr(fn, "torchfl_original")
    g = torch.Generator().manual_seed(0)
    u = torch.randn(1, 4, 5, generator=g)
    args = (u, torch.rand(1, 4, 5, generator=g), -torch.rand(4, 3, generator=g), torch.randn(1, 3, 5, generator=g),
            torch.randn(1, 3, 5, generator=g))
    torch.testing.assert_close(fn(*args), fn.torchfl_original(*args))


@pytest.mark.parametrize("dtype,kernel", [("float32", "copy"), ("float16", "cast")])
def test_copy_into_a_new_buffer_runs_on_the_chip(dtype, kernel):
    """``buf.copy_(x)`` into a fresh buffer (Mamba's cache states) is ``aten.copy.default`` once
    functionalised: the copy kernel (same dtype) or the cast kernel (core 1.24.0; fell back
    before); a broadcasting copy still falls back, with the reason."""
    import torch

    from torchfl.planner import plan_module
    from torchfl.runtime.executor import Executor

    class Write(torch.nn.Module):
        def __init__(self, shape):
            super().__init__()
            self.shape = shape

        def forward(self, x):
            buf = torch.zeros(*self.shape, dtype=getattr(torch, dtype))
            buf.copy_(x * 2)
            return buf + 1

    x = torch.randn(2, 3, 4)
    m = Write((2, 3, 4))
    plan = plan_module(m, (x,), chip="TFL-X1", strict=True)
    assert [s.kernel for s in plan.steps if "aten.copy.default" in s.ops] == [kernel]
    (got,) = Executor(plan).run((x,))
    ref = m(x)
    assert got.dtype == ref.dtype and torch.equal(got, ref)
    wide = plan_module(Write((5, 2, 3, 4)), (x,), chip="TFL-X1")
    assert [f.reason for f in wide.fallbacks if f.op == "aten.copy.default"], wide.fallbacks


def test_training_keeps_the_differentiable_path(fp32_dev):
    """The operator has no backward: a call autograd records runs transformers' own loop (on the chip)."""
    import torch
    from transformers.models.mamba import modeling_mamba as mm

    from torchfl.runtime.eager import ops

    g = torch.Generator().manual_seed(0)
    cpu = [torch.randn(1, 4, 5, generator=g), torch.rand(1, 4, 5, generator=g), -torch.rand(4, 3, generator=g),
           torch.randn(1, 3, 5, generator=g), torch.randn(1, 3, 5, generator=g)]
    args = [t.to(fp32_dev).requires_grad_() for t in cpu]
    before = ops.ROUTES.get(("torchfl::selective_scan", "chip"), 0)
    y = mm.mamba_selective_scan(*args)
    y.sum().backward()
    assert ops.ROUTES.get(("torchfl::selective_scan", "chip"), 0) == before
    assert args[0].grad is not None
    with torch.no_grad():
        torch.testing.assert_close(mm.mamba_selective_scan(*[a.detach() for a in args]).cpu(), y.detach().cpu(),
                                   rtol=1e-5, atol=1e-5)
    assert ops.ROUTES.get(("torchfl::selective_scan", "chip"), 0) == before + 1
