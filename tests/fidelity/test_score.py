"""The scorer: rank correlation and errors on hand-checked numbers, and a small real table
(published A100 and MI210 rows) planned on the bundled real chips."""

from __future__ import annotations

import pytest

from torchfl.fidelity.oneop import Prediction, RowError, capture_row, predict
from torchfl.fidelity.score import overall, score, spearman
from torchfl.fidelity.tables import make_row, parse_table


def test_spearman_on_known_rankings():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, rel=1e-6)   # ties: mean ranks
    assert spearman([1, 2], [2, 1]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_scores_per_chip_and_family_with_unplanned_rows_apart():
    def p(op, meas, pred, chip="C"):
        return Prediction(make_row(chip, op, [[8, 8], [8, 8]] if op == "matmul" else [[8, 8]], "float16", {}, meas,
                                   "s"), chip, pred, "" if pred else "refused")

    preds = [p("matmul", 1.0, 1.1), p("matmul", 2.0, 1.5), p("matmul", 4.0, 4.0), p("matmul", 1.0, None),
             p("softmax", 1.0, 0.5)]
    mm, sm, al = score(preds)
    assert (mm.family, mm.rows, mm.unplanned) == ("matmul", 3, 1)
    assert mm.mean_abs_error == pytest.approx((0.1 + 0.25 + 0.0) / 3)
    assert mm.median_abs_error == pytest.approx(0.1) and mm.max_abs_error == pytest.approx(0.25)
    assert mm.mean_error == pytest.approx((0.1 - 0.25 + 0) / 3)
    assert mm.spearman == pytest.approx(1.0)
    assert [w.row.seconds for w in mm.worst] == [2.0, 1.0, 4.0]
    assert sm.rows == 1 and sm.spearman is None
    assert al.family == "all" and al.rows == 4 and overall(score(preds), "C") == al


REAL = """# five published rows (LLMCompass artifact, BSD-3-Clause; measurements/llmcompass_*.csv)
chip,op,shapes,dtype,args,seconds,source
A100-SXM4-80GB,matmul,8192x4096;4096x4096,bfloat16,,0.001021,llmcompass-ae
A100-SXM4-80GB,matmul,64x12288;12288x12288,bfloat16,,0.00019,llmcompass-ae
A100-SXM4-80GB,softmax,4096x32,float16,,1.31128e-05,llmcompass-ae
MI210,matmul,8192x4096;4096x4096,bfloat16,,0.00229,llmcompass-ae
MI210,gelu,1048576,float16,"{""approximate"": ""tanh""}",2.81333e-05,llmcompass-ae
"""


@pytest.fixture(scope="module")
def real_targets():
    from torchfl.hcd import load_hcd
    from torchfl.planner.target import Target, bundled_packs
    from torchfl.resources import bundled_path

    packs = bundled_packs()
    return {h.chip.name: Target.of(h, packs) for h in (load_hcd(bundled_path("hcd_registry") / f)
                                                      for f in ("a100_sxm4_80gb.hcd", "mi210.hcd"))}


def test_a_small_real_table_scores_on_the_real_chips(real_targets):
    rows = parse_table(REAL, "real.csv").rows
    preds = [predict(r, real_targets[r.chip]) for r in rows]
    assert all(p.predicted_s is not None and p.steps == 1 and not p.fallbacks for p in preds), \
        [p.reason for p in preds]
    gemm, skinny, soft, mi_gemm, gelu = preds
    # the large GEMM is compute bound at the sustained rate: 2*8192*4096^2 / (312e12 * 0.8692 * waves) + launch
    assert gemm.predicted_s == pytest.approx(1.0e-3, rel=0.1)
    assert any("compute bound at 87% sustained" in n for n in gemm.notes)
    # the skinny one streams B (302 MB) at 85.5% of 2039 GB/s
    assert any("off-chip bound at 86% sustained" in n for n in skinny.notes)
    assert soft.predicted_s == pytest.approx(12e-6, rel=0.1)        # launch-bound: +12 us
    assert any("+12 us launch" in n for n in soft.notes)
    assert any("+34 us launch" in n for n in mi_gemm.notes)
    for p in preds:
        assert abs(p.error) < 0.3, (p.row.label(), p.predicted_s, p.row.seconds)
    scores = score(preds)
    a100 = overall(scores, "A100-SXM4-80GB")
    assert a100.rows == 3 and a100.mean_abs_error < 0.15 and a100.spearman == pytest.approx(1.0)


def test_the_largest_gemm_plans_on_meta_tensors_without_allocating(real_targets):
    import resource

    row = make_row("A100-SXM4-80GB", "matmul", "32768x12288;12288x12288", "bfloat16", "", 0.03544, "llmc")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    p = predict(row, real_targets["A100-SXM4-80GB"])
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert p.predicted_s == pytest.approx(0.03544, rel=0.1)
    assert grown_mb < 300         # the inputs alone would be 1.1 GB


def test_a_row_that_does_not_fit_its_op_is_located():
    with pytest.raises(RowError, match=r"t.csv:7: args: aten.layer_norm.default has no argument foo"):
        capture_row(make_row("C", "layer_norm", "4x8", "float16", '{"foo": 1}', 1e-5, "s", file="t.csv", line=7))
    with pytest.raises(RowError, match=r"t.csv:3: shapes: aten.mm.default needs the tensor mat2"):
        capture_row(make_row("C", "matmul", "4x8", "float16", "", 1e-5, "s", file="t.csv", line=3))
    with pytest.raises(RowError, match=r"t.csv:4: .*does not run as given"):
        capture_row(make_row("C", "matmul", "4x8;9x8", "float16", "", 1e-5, "s", file="t.csv", line=4))
    with pytest.raises(RowError, match=r"no ATen overload aten.nosuchop.default"):
        capture_row(make_row("C", "aten.nosuchop.default", "4", "float16", "", 1e-5, "s"))


def test_an_unplannable_row_is_a_prediction_with_its_reason():
    from torchfl.hcd import load_hcd
    from torchfl.planner.target import Target, bundled_packs
    from torchfl.resources import bundled_path

    npu = Target.of(load_hcd(bundled_path("hcd_registry") / "npu_v3.hcd"), bundled_packs())
    p = predict(make_row("NPU-V3", "softmax", "4096x32", "float16", "", 1e-5, "s"), npu)
    assert p.predicted_s is None and "max_batch_size" in p.reason and p.error is None
