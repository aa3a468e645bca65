"""The executor over a Plan built by hand from the Plan dataclasses and the kernels' own
specs (no planner): real kernels, real device memory, a real CPU fallback."""
import numpy as np
import pytest
import torch

from torchfl.kernels import ChipModel
from torchfl.kernels.catalog import CATALOG
from torchfl.planner.plan import Capture, Fallback, Plan, PlanInput, Step, Summary, Value
from torchfl.runtime.analyze import analyze
from torchfl.runtime.errors import FallbackNotAllowed, PlanMismatch
from torchfl.runtime.executor import Executor

CHIP = ChipModel(name="HAND-1", cache_bytes=16 << 10, alignment=128)


def _graph():
    """x -> convolution(x, w) -> relu, as a core-ATen FX graph."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    w = g.placeholder("p_w")
    conv = g.call_function(torch.ops.aten.convolution.default,
                           (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
    relu = g.call_function(torch.ops.aten.relu.default, (conv,))
    g.output((relu,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    return gm, conv.name, relu.name


def _kstep(index, kernel, inputs, metas, outputs, attrs, chip, kind="kernel", nodes=(), ops=(), static=False):
    """A Step priced by the kernel's own tiling (what a planner would write)."""
    spec = CATALOG[kernel]
    shapes = {n: m[0] for n, m in zip(spec.input_names, metas) if m}
    dtypes = {n: m[1] for n, m in zip(spec.input_names, metas) if m}
    layouts = {n: m[2] for n, m in zip(spec.input_names, metas) if m}
    first = next(m[1] for m in metas if m)
    problem = spec.problem(shapes, attrs, None if spec.mixed_dtypes else first, layouts, dtypes)
    tp = spec.tile(problem, chip)
    (out,) = spec.output_meta(problem)
    from torchfl.kernels.tiling import simulated_time

    step = Step(index=index, kind=kind, kernel=kernel, nodes=tuple(nodes), ops=tuple(ops),
                inputs=tuple(inputs), outputs=tuple(outputs),
                layouts_in=tuple((m[2] or "NCHW") if m else "" for m in metas),
                layout_out=out.layout or "NCHW", dtype=problem.dtype, tile=tp.config.as_dict(),
                attrs=dict(attrs), predicted_flops=float(tp.traffic.flops),
                predicted_bytes=float(tp.traffic.bytes), predicted_time_s=simulated_time(tp, chip, problem.dtype),
                static=static)
    return step, (out.shape, out.dtype, out.layout)


def hand_plan(x_shape=(1, 3, 8, 8), w_shape=(4, 3, 3, 3)):
    gm, conv_name, relu_name = _graph()
    torch.manual_seed(0)
    w = torch.randn(w_shape)
    s0, m0 = _kstep(0, "layout_transform", ("x",), [(x_shape, "float32", None)], ("x.NHWC",),
                    {"layout": "NHWC"}, CHIP, kind="layout")
    s1, m1 = _kstep(1, "cast", ("p_w",), [(w_shape, "float32", None)], ("p_w.float16",),
                    {"to": "float16"}, CHIP, kind="cast", static=True)
    s2, m2 = _kstep(2, "cast", ("x.NHWC",), [m0], ("x.NHWC.float16",), {"to": "float16"}, CHIP, kind="cast")
    s3, m3 = _kstep(3, "conv2d", ("x.NHWC.float16", "p_w.float16", ""), [m2, m1, None], (conv_name,),
                    {"stride": [1, 1], "padding": [1, 1], "out_layout": "NHWC"}, CHIP,
                    nodes=(conv_name,), ops=("aten.convolution.default",))
    s4, m4 = _kstep(4, "layout_transform", (conv_name,), [m3], (f"{conv_name}.NCHW",), {"layout": "NCHW"},
                    CHIP, kind="layout")
    s5, m5 = _kstep(5, "cast", (f"{conv_name}.NCHW",), [m4], (f"{conv_name}.NCHW.float32",),
                    {"to": "float32"}, CHIP, kind="cast")
    nbytes = int(np.prod(m5[0])) * 4
    s6 = Step(index=6, kind="fallback", kernel=None, nodes=(relu_name,), ops=("aten.relu.default",),
              inputs=(f"{conv_name}.NCHW.float32",), outputs=(relu_name,), layouts_in=("NCHW",),
              layout_out="NCHW", dtype="float32", tile={"strategy": "cpu"}, attrs={},
              predicted_flops=0.0, predicted_bytes=float(2 * nbytes),
              predicted_time_s=2 * nbytes * 2 / CHIP.offchip_bw)
    steps = (s0, s1, s2, s3, s4, s5, s6)
    values = {"x": Value("x", x_shape, "float32", "NCHW", None), "p_w": Value("p_w", w_shape, "float32", "NCHW", None)}
    for st, m in zip(steps, (m0, m1, m2, m3, m4, m5, (m5[0], "float32", None))):
        for o in st.outputs:
            values[o] = Value(o, tuple(m[0]), m[1], m[2] or "NCHW", st.index)
    summary = Summary(2, 1, 6, 0, 2, 3, 1, sum(s.predicted_flops for s in steps),
                      sum(s.predicted_bytes for s in steps), sum(s.predicted_time_s for s in steps))
    plan = Plan(chip=CHIP.name, chip_version="0.0.1", precision="float16",
                inputs=(PlanInput("x", "input", 0, x_shape, "float32", "NCHW"),
                        PlanInput("p_w", "parameter", "w", w_shape, "float32", "NCHW")),
                outputs=(relu_name,), values=values, steps=steps, conversions=(), casts=(),
                fallbacks=(Fallback(relu_name, "aten.relu.default", "hand-built: runs on the CPU"),),
                rejected=(), summary=summary, capture=Capture(gm, {"p_w": w}))
    return plan, w


def _reference(x, w):
    xh, wh = x.half().float(), w.half().float()
    return torch.relu(torch.nn.functional.conv2d(xh, wh, padding=1))


def test_hand_plan_runs_real_kernels_and_fallback():
    plan, w = hand_plan()
    ex = Executor(plan, CHIP)
    x = torch.randn(1, 3, 8, 8)
    (y,) = ex.run((x,))
    assert y.dtype == torch.float32 and y.shape == (1, 4, 8, 8) and y.is_contiguous()
    torch.testing.assert_close(y, _reference(x, w), rtol=2e-3, atol=2e-3)
    # a second call reuses the cached fp16 weight (static step) and gives the same result
    (y2,) = ex.run((x,))
    torch.testing.assert_close(y2, y, rtol=0, atol=0)


def test_memory_is_freed_and_static_weights_stay():
    plan, _w = hand_plan()
    ex = Executor(plan, CHIP)
    mem = ex.memory
    base = mem.memory_allocated()
    ex.run((torch.randn(1, 3, 8, 8),))
    kept = mem.memory_allocated() - base
    # what stays is exactly the weight's fp16 cast, in alignment granules (the fp32 upload
    # is freed after its only reader, the static cast) -- as the plan's memory plan says
    g = CHIP.alignment
    want = -(-4 * 3 * 3 * 3 * 2 // g) * g
    assert ex.memory_plan.resident_bytes == want
    assert kept == want
    ex.run((torch.randn(1, 3, 8, 8),))
    assert mem.memory_allocated() - base == want
    ex.release()
    assert mem.memory_allocated() == base


def test_analyze_predicted_bytes_equal_measured():
    plan, _w = hand_plan()
    an = analyze(plan, (torch.randn(1, 3, 8, 8),), chip=CHIP)
    assert len(an.steps) == len(plan.steps)
    for s in an.steps:
        assert s.bytes_match, (s.index, s.kernel, s.predicted_bytes, s.measured_bytes)
        assert s.measured_bytes > 0
    assert an.routes["aten.convolution.default"] == {"conv2d": 1}
    assert an.routes["aten.relu.default"] == {"CPU fallback": 1}
    text = an.render()
    assert "equal on every step" in text
    assert ("Largest predicted-vs-simulated" in text) != ("equals the time simulated" in text)


def test_measured_run_reads_the_kept_frozen_weights_and_frees_only_its_own():
    """analyze's warm run executes and counts the static steps (the weight's cast) but feeds
    the per-call steps the executor's kept, frozen values, as a real call does (a GEMM keeps
    its packed B only for a frozen buffer); it frees its own temporaries, never a kept one."""
    from torchfl.kernels.frozen import is_frozen
    from torchfl.runtime.executor import Record

    plan, w = hand_plan()
    ex = Executor(plan, CHIP)
    mem = ex.memory
    base = mem.memory_allocated()
    x = torch.randn(1, 3, 8, 8)
    ex.run((x,))
    kept = [v for v in ex._base if v is not None and not v.buffer.freed]   # the fp16 cast (the upload is freed)
    assert len(kept) == 1 and is_frozen(kept[0].buffer)
    conv = next(p for p in ex.preps if p.kernel == "conv2d")
    seen, call = [], conv.call
    conv.call = lambda inputs: (seen.append([t.buffer for t in inputs.values() if t is not None]), call(inputs))[1]
    rec = Record(kept_static=True)
    (y,) = ex.run((x,), rec)
    torch.testing.assert_close(y, _reference(x, w), rtol=2e-3, atol=2e-3)
    assert any(b is kept[0].buffer for b in seen[0])                 # the kept fp16 weight, not a fresh cast
    assert {r.index for r in rec.steps} == {s.index for s in plan.steps}   # the cast still ran and counted
    assert not kept[0].buffer.freed
    assert mem.memory_allocated() - base == ex.memory_plan.resident_bytes
    an = analyze(plan, (x,), executor=ex)
    assert all(s.bytes_match for s in an.steps) and not kept[0].buffer.freed


def test_strict_refuses_fallbacks_before_running():
    plan, _w = hand_plan()
    with pytest.raises(FallbackNotAllowed) as err:
        Executor(plan, CHIP, strict=True)
    assert "aten::relu" in str(err.value) and "hand-built" in str(err.value)


def test_tiling_mismatch_is_refused():
    plan, _w = hand_plan()
    small = ChipModel(name="HAND-1", cache_bytes=2 << 10, alignment=128)
    ex = Executor(plan, small)
    with pytest.raises(PlanMismatch, match="re-plan"):
        ex.run((torch.randn(1, 3, 8, 8),))


def test_caching_allocator_accounting_and_oom():
    from torchfl.kernels import DeviceOOMError
    from torchfl.runtime.device import caching_memory

    chip = ChipModel(name="HAND-OOM", alignment=256, memory_bytes=64 << 10)
    mem = caching_memory(chip)
    a = mem.alloc(1000)
    assert a.address % 256 == 0 and mem.memory_allocated() == 1024
    a.free()
    assert mem.memory_allocated() == 0 and mem.memory_reserved() == 1024
    b = mem.alloc(900)                      # same granule: the cached block is reused
    assert b.address == a.address and mem.memory_reserved() == 1024
    with pytest.raises(ValueError, match="freed"):
        a.view("uint8", (10,))
    b.free()
    big = mem.alloc(60 << 10)               # needs the cache emptied first: still fits
    assert mem.memory_allocated() == 60 << 10
    with pytest.raises(DeviceOOMError, match="out of memory on HAND-OOM"):
        mem.alloc(8 << 10)
    big.free()
    mem.empty_cache()
    assert mem.memory_reserved() == 0


def test_analyze_reports_progress_per_step():
    plan, _w = hand_plan()
    seen = []
    analyze(plan, (torch.randn(1, 3, 8, 8),), chip=CHIP, progress=lambda d, t, s: seen.append((d, t, s.index)))
    assert seen == [(i + 1, len(plan.steps), i) for i in range(len(plan.steps))]


def test_select_drops_its_dim_on_the_chip():
    """aten.select.int runs as a one-wide slice; its result has the node's shape (the sliced
    dim dropped), as eager's: was (5, 1, 5) for x.select(1, 2) (found by OpInfo select)."""
    import torch

    x = torch.randn(5, 4, 5).half()
    for dim, index in ((1, 2), (-1, -1), (0, 0)):
        f = torch.compile(lambda t, d=dim, i=index: t.select(d, i) * 2, backend="torchfl",
                          options={"chip": "NPU-V3", "strict": True})
        torch._dynamo.reset()
        got = f(x)
        assert got.shape == x.select(dim, index).shape
        torch.testing.assert_close(got, x.select(dim, index) * 2)


def test_a_failed_run_returns_its_memory_and_a_fitting_batch_runs_after_it():
    """Issue #20: after an out-of-memory error on a small-memory chip the failed run's buffers
    stayed allocated, and a batch that fitted before failed ("163.87 KiB free of 4.10 MiB")."""
    from torchfl.kernels import DeviceOOMError

    chip = ChipModel(name="HAND-1", cache_bytes=16 << 10, alignment=128, memory_bytes=48 << 10)
    small, w = hand_plan()                        # peak 2.75 KiB
    big, _ = hand_plan(x_shape=(2, 3, 32, 32))    # peak 64.75 KiB: fails part-way, after allocating
    x, xb = torch.randn(1, 3, 8, 8), torch.randn(2, 3, 32, 32)
    fits, too_big = Executor(small, chip), Executor(big, chip)
    mem = fits.memory
    assert too_big.memory is mem and mem.memory_allocated() == 0
    with pytest.raises(DeviceOOMError, match="out of memory on HAND-1"):
        too_big.run((xb,))
    assert mem.memory_allocated() == 0            # the first run's weight uploads included
    (y,) = fits.run((x,))
    torch.testing.assert_close(y, _reference(x, w), rtol=2e-3, atol=2e-3)
    cached = mem.memory_allocated()               # the fitting executor's cached weights
    assert cached > 0
    mem.reset_peak_memory_stats()
    with pytest.raises(DeviceOOMError):
        too_big.run((xb,))
    assert mem.max_memory_allocated() > cached and mem.memory_allocated() == cached
    (y2,) = fits.run((x,))                        # same process, same memory: still fits
    torch.testing.assert_close(y2, y, rtol=0, atol=0)
    fits.release()
    assert mem.memory_allocated() == 0


def test_an_executor_whose_init_raised_is_collected_quietly():
    """``__del__`` catches nothing: an executor refused in ``__init__`` must still release
    cleanly when collected (no "Exception ignored in" from a missing attribute)."""
    import gc
    import sys

    plan, _w = hand_plan()
    seen = []
    old, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        with pytest.raises(FallbackNotAllowed):
            Executor(plan, CHIP, strict=True)
        gc.collect()
    finally:
        sys.unraisablehook = old
    assert [f"{u.exc_type.__name__}: {u.exc_value}" for u in seen] == []


def test_finaliser_survives_module_teardown(monkeypatch):
    """At interpreter shutdown a module's globals become None before the objects they hold
    are collected (seen at the end of a pytest run: "'NoneType' object has no attribute
    'is_finalizing'"): ``__del__`` reads no module global before it knows it may run."""
    import torchfl.runtime.executor as executor_module

    plan, _w = hand_plan()
    ex = Executor(plan, CHIP)
    ex.run((torch.randn(1, 3, 8, 8),))
    monkeypatch.setattr(executor_module, "sys", None)
    ex.__del__()
    assert ex._base is None
