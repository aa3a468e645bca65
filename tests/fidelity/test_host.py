"""Host rows: torch's own eager ops timed on this machine, as fidelity-table rows that can be
called again from the CSV alone (the scorer's input)."""
from __future__ import annotations

import pytest
import torch

from torchfl.fidelity.host import (HostTable, OpRow, call_row, family_of, model_rows, plain_rows, plain_specs,
                                   read_csv, write_csv)


@pytest.fixture(scope="module")
def models() -> HostTable:
    return model_rows(quick=True, sample_s=0.0005, repeat=3)


def test_model_rows_cover_the_resnet_and_bert_ops(models):
    ops = {r.op for r in models.rows}
    for op in ("aten.conv2d.default", "aten._native_batch_norm_legit_no_training.default", "aten.relu.default",
               "aten.add.Tensor", "aten.max_pool2d.default", "aten.mean.dim", "aten.linear.default",
               "aten.layer_norm.default", "aten.scaled_dot_product_attention.default", "aten.gelu.default",
               "aten.embedding.default"):
        assert op in ops, op
    for r in models.rows:
        assert r.seconds > 0 and len(r.runs) == 3 and min(r.runs) <= r.seconds <= max(r.runs)
        assert r.dtype == "float32"
    # repeated blocks are timed once; every timed node is counted in exactly one row
    assert sum(r.count for r in models.rows) == sum(len(r.nodes) for r in models.rows)
    assert any(r.count > 1 for r in models.rows)
    assert len({r.key for r in models.rows}) == len(models.rows)


def test_skipped_nodes_say_why(models):
    whys = {why for _case, _node, _op, why in models.skipped}
    assert any("folds" in w for w in whys)          # BERT's position ids and mask: no user input
    assert any("tuple element" in w for w in whys)   # getitem of batch norm's outputs
    assert not any(op.startswith("aten.conv") for _c, _n, op, _w in models.skipped)


def test_rows_keep_absent_optional_tensors_and_schema_names(models):
    conv = next(r for r in models.rows if r.op == "aten.conv2d.default")
    assert "bias" not in conv.args and len(conv.shapes) == 2     # trailing absent tensors are left out
    sdpa = next(r for r in models.rows if r.family == "attention")
    assert len(sdpa.shapes[0]) == 4        # (batch, heads, length, head_dim)


def test_csv_round_trip_and_every_row_callable(models):
    plain = plain_rows(quick=True, sample_s=0.0005, repeat=3)
    rows = models.rows + plain.rows
    text = write_csv(rows, "HOST-TEST", ["measured by the test"])
    assert text.startswith("# measured by the test\nchip,op,shapes,dtype,args,seconds,source\n")
    back = read_csv(text)
    assert [(r.op, r.shapes, r.args) for r in back] == [(r.op, [list(s) for s in r.shapes], r.args) for r in rows]
    for r in back:
        fn, _ = call_row(r.op, r.shapes, r.dtype, r.args)
        with torch.no_grad():
            out = fn()
        assert out is not None


def test_call_row_reads_an_absent_tensor_before_a_present_one():
    """batch norm without affine parameters: weight and bias are null, the running stats follow."""
    fn, (pos, _kw) = call_row("aten._native_batch_norm_legit_no_training.default", [[1, 4, 2, 2], [4], [4]],
                              "float32", {"weight": None, "bias": None, "momentum": 0.1, "eps": 1e-5})
    assert pos[1] is None and pos[2] is None and tuple(pos[3].shape) == (4,)
    out = fn()[0]
    assert out.shape == (1, 4, 2, 2)


def test_call_row_errors_name_the_op():
    with pytest.raises(ValueError, match="aten.mm.default: 1 tensor shape"):
        call_row("aten.mm.default", [[2, 2]], "float32", {})
    with pytest.raises(ValueError, match="not an ATen overload"):
        call_row("mm", [[2, 2], [2, 2]], "float32", {})
    with pytest.raises(ValueError, match="no such ATen overload"):
        call_row("aten.mm.nonesuch", [[2, 2], [2, 2]], "float32", {})


def test_plain_specs_cover_the_families():
    fams = {family_of(op) for op, *_ in plain_specs()}
    assert {"matmul", "conv", "softmax", "norm", "elementwise"} <= fams


def test_timing_follows_the_work():
    """A 256^3 GEMM row takes longer than a 64^3 one (the timer measures the call, not noise)."""
    small = OpRow("aten.mm.default", [[64, 64], [64, 64]], "float32", {})
    big = OpRow("aten.mm.default", [[256, 256], [256, 256]], "float32", {})
    from torchfl.fidelity.host import _time
    from torchfl.fidelity.probe import Timer

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = [sorted(_time(call_row(r.op, r.shapes, r.dtype, r.args)[0], Timer("cpu"), 0.002, 3))[1]
                 for r in (small, big)]
    finally:
        torch.set_num_threads(old)
    assert times[1] > 8 * times[0]          # 64x the work; at least 8x the time
