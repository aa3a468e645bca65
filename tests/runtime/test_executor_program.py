"""The executor's compiled program: buffer frees decided when the plan is compiled, with
metadata reshapes sharing their input's buffer. Real kernels and real device memory on a
plan built by hand (no planner), observed through memory_allocated()."""
import torch

from tests.runtime.test_executor import CHIP, _kstep
from torchfl.planner.plan import Capture, Plan, PlanInput, Summary, Value
from torchfl.runtime.executor import Executor, Record


def _granule(nbytes):
    g = CHIP.alignment
    return max(g, -(-nbytes // g) * g)


def alias_plan(n=96, x_layout=None):
    """x[2, n] fp32 (row-major, or stored ``x_layout``) and a parameter b[1, 2n] fp32:

    0 reshape x -> xr [1, 2n]      (row-major x: metadata, xr is x's buffer; else a copy)
    1 cast xr -> xr16              (reads the x/xr buffer)
    2 cast x -> x16                (reads it again: x dies here, not at step 1)
    3 reshape x16 -> x16r [1, 2n]  (a view of x16, or a copy)
    4 add xr16 + x16r -> s         (x16/x16r and xr16 die here)
    5 cast b -> b16                (static: runs once, stays on the chip)
    6 add s + b16 -> y
    7 cast y -> y32                (the output)
    """
    xs, flat = (2, n), (1, 2 * n)
    mx = (xs, "float32", x_layout)
    s0, m0 = _kstep(0, "reshape", ("x",), [mx], ("xr",), {"shape": flat}, CHIP, kind="layout")
    s1, m1 = _kstep(1, "cast", ("xr",), [m0], ("xr16",), {"to": "float16"}, CHIP, kind="cast")
    s2, m2 = _kstep(2, "cast", ("x",), [mx], ("x16",), {"to": "float16"}, CHIP, kind="cast")
    s3, m3 = _kstep(3, "reshape", ("x16",), [m2], ("x16r",), {"shape": flat}, CHIP, kind="layout")
    s4, m4 = _kstep(4, "add", ("xr16", "x16r"), [m1, m3], ("s",), {}, CHIP)
    s5, m5 = _kstep(5, "cast", ("p_b",), [(flat, "float32", None)], ("p_b16",), {"to": "float16"}, CHIP,
                    kind="cast", static=True)
    s6, m6 = _kstep(6, "add", ("s", "p_b16"), [m4, m5], ("y",), {}, CHIP)
    s7, m7 = _kstep(7, "cast", ("y",), [m6], ("y32",), {"to": "float32"}, CHIP, kind="cast")
    steps = (s0, s1, s2, s3, s4, s5, s6, s7)
    view = x_layout is None
    assert (s0.tile["strategy"] == "metadata") == view and (s3.tile["strategy"] == "metadata") == view
    values = {"x": Value("x", xs, "float32", x_layout or "AB", None),
              "p_b": Value("p_b", flat, "float32", "AB", None)}
    for st, m in zip(steps, (m0, m1, m2, m3, m4, m5, m6, m7)):
        values[st.outputs[0]] = Value(st.outputs[0], tuple(m[0]), m[1], m[2] or "AB", st.index)
    summary = Summary(2, 0, 8, 0, 0, 4, 0, 0.0, sum(s.predicted_bytes for s in steps), 0.0)
    torch.manual_seed(0)
    b = torch.randn(flat)
    plan = Plan(chip=CHIP.name, chip_version="0.0.1", precision="float16",
                inputs=(PlanInput("x", "input", 0, xs, "float32", x_layout or "AB"),
                        PlanInput("p_b", "parameter", "b", flat, "float32", "AB")),
                outputs=("y32",), values=values, steps=steps, conversions=(), casts=(), fallbacks=(),
                rejected=(), summary=summary, capture=Capture(None, {"p_b": b}))
    return plan, b


def _expected(x, b):
    h = x.half()
    return ((h.reshape(1, -1).float() + h.reshape(1, -1).float()).half().float() + b.half().float()).half().float()


def test_program_result_and_memory_kept_is_the_cached_weights():
    plan, b = alias_plan()
    ex = Executor(plan, CHIP)
    mem = ex.memory
    base = mem.memory_allocated()
    kept = _granule(b.numel() * 2)   # the fp16 cast; the fp32 upload dies after its only reader, the cast
    for _ in range(3):          # first call (static steps run) and cached calls (they do not)
        x = torch.randn(2, 96)
        (y,) = ex.run((x,))
        torch.testing.assert_close(y, _expected(x, b), rtol=0, atol=0)
        # no leak and no double free of the shared reshape buffers: only the weights stay
        assert mem.memory_allocated() - base == kept
    ex.release()
    assert mem.memory_allocated() == base


def test_shared_buffer_freed_after_its_last_reader_of_either_name():
    plan, _b = alias_plan()
    ex = Executor(plan, CHIP)
    mem = ex.memory
    base = mem.memory_allocated()
    live = []
    rec = Record(on_step=lambda done, total, step: live.append(mem.memory_allocated() - base))
    ex.run((torch.randn(2, 96),), rec)
    gx, gh = _granule(2 * 96 * 4), _granule(2 * 96 * 2)       # an fp32 and an fp16 activation
    gb, gbh = _granule(2 * 96 * 4), _granule(2 * 96 * 2)      # the parameter and its cast
    # the measuring run uploads the parameter afresh, with the input
    want = [gx + gb,             # 0 reshape: xr views x, nothing new
            gx + gb + gh,        # 1 cast xr: x/xr is read again by step 2
            gb + 2 * gh,         # 2 cast x: x (and its view xr) die after this second reader
            gb + 2 * gh,         # 3 reshape x16: a view, nothing new
            gb + gh,             # 4 add: xr16 and x16/x16r die, s is born
            gbh + gh,            # 5 static cast of the parameter (resident); the fp32 upload dies
            gbh + gh,            # 6 add: s dies, y is born
            gbh + gx]            # 7 cast: y dies; the output y32 lives until the download
    assert live == want
    # everything of a measuring run is temporary
    assert mem.memory_allocated() == base
    # the peak: step 2 writes x16 while x, xr16 and the parameter are live
    assert rec.peak_bytes == gx + gb + 2 * gh


def test_outputs_read_twice_and_aliases_do_not_change_results_between_calls():
    """The dynamic program (static results cached) and the full one give the same bits,
    and a weight changed in place (its version counter) is uploaded and cast again."""
    plan, b = alias_plan(n=40)
    ex = Executor(plan, CHIP)
    x = torch.randn(2, 40)
    (y1,) = ex.run((x,))
    (y2,) = ex.run((x,))
    assert torch.equal(y1, y2)
    with torch.no_grad():
        b.add_(1.0)
    (y3,) = ex.run((x,))
    torch.testing.assert_close(y3, _expected(x, b), rtol=0, atol=0)
    assert not torch.equal(y3, y2)
    ex.release()


def test_reshape_of_a_laid_out_input_is_a_copy_with_its_own_buffer():
    """x stored column-major: both reshapes move bytes into buffers of their own, which the
    program frees on their own schedule (a view's schedule would leak or free twice)."""
    plan, b = alias_plan(n=40, x_layout="BA")
    ex = Executor(plan, CHIP)
    assert not any(p.alias for p in ex.preps)
    mem = ex.memory
    base = mem.memory_allocated()
    x = torch.randn(2, 40)
    for _ in range(2):
        (y,) = ex.run((x,))
        torch.testing.assert_close(y, _expected(x, b), rtol=0, atol=0)
        assert mem.memory_allocated() - base == _granule(80 * 2)
    ex.release()
    assert mem.memory_allocated() == base
