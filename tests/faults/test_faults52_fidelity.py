"""Issue 52 cases 6, 7, 8 and 15 (second half): fidelity tables. Before: a row's ``args`` JSON
nested 10,000 deep raised RecursionError (a traceback); shapes of 2**40 x 2**40 aborted the whole
run with ``Storage size calculation overflowed`` (the table's good rows lost); ``seconds: 5e-324``
was scored and ``--record`` stored "mean inf%" as append-only evidence; a softmax row with
``{"dim": 99}`` on a 2-D tensor was scored (0.2 us); one row whose op does not run on its shapes
made torch's logger print 19 ``E... Traceback`` lines. Now: implausible rows are refused at load
with file:line, a run scores every row it can and reports the rest as not planned with the
reason, and no statistic is inf or nan."""

from __future__ import annotations

import csv
import math

import pytest

from torchfl.fidelity.tables import TableError, load_table, make_row
from torchfl.hcd import load_hcd
from torchfl.resources import bundled_path

HEADER = "chip,op,shapes,dtype,args,seconds,source".split(",")


def write(tmp_path, rows, name="t.csv"):
    path = tmp_path / name
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def npu():
    from torchfl.planner.target import resolve_target

    return resolve_target(load_hcd(bundled_path("hcd_registry") / "npu_v3.hcd"))


def test_deeply_nested_args_are_refused_at_their_line(tmp_path):
    deep = '{"a": ' * 10_000 + "1" + "}" * 10_000
    path = write(tmp_path, [("NPU-V3", "softmax", "64x64", "float16", deep, "1e-5", "deep")])
    with pytest.raises(TableError) as exc:
        load_table(path)
    (problem,) = exc.value.problems
    assert problem.startswith(f"{path}:2: args: JSON nested deeper than 8 levels"), problem


def test_args_nesting_inside_strings_does_not_count():
    row = make_row("NPU-V3", "softmax", "64x64", "float16", '{"dim": -1, "note": "[[[[[[[[[[[[{{{{"}', "1e-5", "s")
    assert row.args["dim"] == -1


def test_shapes_no_tensor_can_hold_are_refused_at_their_line(tmp_path):
    big = 2 ** 40
    path = write(tmp_path, [("NPU-V3", "matmul", "64x64;64x64", "float16", "", "1e-5", "good"),
                            ("NPU-V3", "matmul", f"{big}x{big};{big}x64", "float16", "", "1e-5", "huge")])
    with pytest.raises(TableError) as exc:
        load_table(path)
    (problem,) = exc.value.problems
    assert problem.startswith(f"{path}:3: shapes: ") and "elements" in problem, problem


@pytest.mark.parametrize("seconds", ["5e-324", "1e-320", "1e-12", "0", "-1e-5", "nan", "inf", "1e9"])
def test_implausible_measurements_are_refused_at_load(tmp_path, seconds):
    path = write(tmp_path, [("NPU-V3", "matmul", "64x64;64x64", "float16", "", seconds, "x")])
    with pytest.raises(TableError) as exc:
        load_table(path)
    (problem,) = exc.value.problems
    assert problem.startswith(f"{path}:2: seconds: "), problem


def test_a_dim_out_of_range_is_not_planned_with_the_reason(npu):
    from torchfl.fidelity.oneop import predict

    for dim in (99, 2, -3):
        p = predict(make_row("NPU-V3", "softmax", "64x64", "float16", f'{{"dim": {dim}}}', "1e-5", "x"), npu)
        assert p.predicted_s is None and f"args: dim {dim} is out of range for the 2-D input 64x64" in p.reason
    p = predict(make_row("NPU-V3", "softmax", "64x64", "float16", '{"dim": -2}', "1e-5", "x"), npu)
    assert p.predicted_s is not None and p.predicted_s > 0


def test_a_run_scores_every_row_it_can_and_no_statistic_is_infinite(tmp_path, npu):
    from torchfl.fidelity.run import score_tables

    path = write(tmp_path, [("NPU-V3", "matmul", "64x64;64x64", "float16", "", "1e-5", "good1"),
                            ("NPU-V3", "softmax", "64x64", "float16", '{"dim": 99}', "1e-5", "dim99"),
                            ("NPU-V3", "aten.mm.default", "4x5;6x7", "float16", "", "1e-5", "badmm"),
                            ("NPU-V3", "matmul", "128x128;128x128", "float16", "", "2e-5", "good2")])
    result = score_tables([load_table(path)], lambda name: npu)
    by_source = {p.row.source: p for p in result.predictions}
    assert by_source["good1"].predicted_s and by_source["good2"].predicted_s
    assert by_source["dim99"].predicted_s is None and "dim 99" in by_source["dim99"].reason
    assert by_source["badmm"].predicted_s is None and f"{path}:4:" in by_source["badmm"].reason
    (total,) = [s for s in result.scores if s.family == "all"]
    assert (total.rows, total.unplanned) == (2, 2)
    (mm,) = [s for s in result.scores if s.family == "matmul"]
    for v in (mm.mean_abs_error, mm.median_abs_error, mm.max_abs_error, mm.mean_error):
        assert v is not None and math.isfinite(v)
    for s in result.scores:
        assert all(v is None or math.isfinite(v) for v in (s.mean_abs_error, s.max_abs_error, s.mean_error))


def test_a_bad_row_prints_no_torch_traceback(capfd, npu):
    from torchfl.fidelity.oneop import predict

    p = predict(make_row("NPU-V3", "aten.add.Tensor", "4x5;6x7", "float16", "", "1e-5", "x"), npu)
    assert p.predicted_s is None and "does not run as given (Attempting to broadcast" in p.reason
    err = capfd.readouterr().err
    assert "Traceback" not in err and "fake_tensor.py" not in err, err[:2000]


def test_any_row_text_loads_or_is_a_located_table_error():
    """A fuzz of the seven fields (JSON-ish args, dims, numbers in every spelling): make_row
    returns a row or raises TableError naming the line, never another exception."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    brackets = st.text(alphabet='[]{}":,0123456789-e. adimx', max_size=60)
    number = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=12),
                       st.sampled_from(["5e-324", "1e-320", "-0", "0x10", "1_000", "nan", "1e309"]))
    dims = st.lists(st.one_of(st.integers(0, 2 ** 62).map(str), st.text(max_size=4)), max_size=5).map("x".join)
    shapes = st.lists(dims, max_size=3).map(";".join)
    ops = st.sampled_from(["matmul", "softmax", "aten.mm.default", "aten._softmax.default", "bogus", "", "decode"])

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(op=ops, shapes=shapes, dtype=st.sampled_from(["float16", "torch.float32", "int4", ""]),
           args=st.one_of(brackets, st.just('{"a": ' * 50 + "1" + "}" * 50)), seconds=number,
           source=st.text(max_size=5))
    def check(op, shapes, dtype, args, seconds, source):
        try:
            row = make_row("NPU-V3", op, shapes, dtype, args, seconds, source, file="f.csv", line=7)
        except TableError as exc:
            assert exc.problems and all(p.startswith("f.csv:7: ") for p in exc.problems), exc.problems
        else:
            assert math.isfinite(row.seconds) and 1e-9 <= row.seconds <= 86_400

    check()


def test_any_loadable_row_is_predicted_or_not_planned(npu):
    """Rows that load, with shapes and args that may not fit their op: predict returns a
    Prediction (a finite time, or none with the row's reason), never raises."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from torchfl.fidelity.oneop import predict

    shape = st.lists(st.integers(0, 6), min_size=0, max_size=4).map(lambda d: "x".join(map(str, d)))
    ops = st.sampled_from(["matmul", "softmax", "layer_norm", "gelu", "aten.add.Tensor", "aten.sum.dim_IntList",
                           "aten.transpose.int", "aten.mm.default"])
    args = st.sampled_from(["", '{"dim": 99}', '{"dim": [0, 5]}', '{"dim0": 0, "dim1": -7}', '{"alpha": 2}',
                            '{"dim": "x"}', '{"bogus": 1}', '{"dim": -1}'])

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(op=ops, shapes=st.lists(shape, min_size=1, max_size=2).map(";".join), args=args)
    def check(op, shapes, args):
        try:
            row = make_row("NPU-V3", op, shapes, "float16", args, "1e-5", "fuzz", file="f.csv", line=3)
        except TableError:
            return
        p = predict(row, npu)
        assert (p.predicted_s is None and p.reason) or (math.isfinite(p.predicted_s) and p.predicted_s >= 0), p

    check()
