"""Matching rules against every bundled chip: outcomes follow from the HCDs' own numbers."""

from __future__ import annotations

import pytest

from torchfl.hcd import load_hcd, load_hcd_text
from torchfl.resources import bundled_hcds, bundled_path
from torchfl.rules import Call, TensorMeta, load_pack, load_pack_text
from torchfl.rules.matching import candidates, match, match_fusion
from torchfl.rules.support import chip_ops

CHIPS = {load_hcd(p).chip.name: load_hcd(p) for p in bundled_hcds()}
CORE = load_pack(bundled_path("rules") / "core.yaml")
UNIT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int8": "int8"}
CONV_DTYPES = ("float32", "float16", "bfloat16", "int8")
# int8 convolution is the quantised fusion's (qconv2d, with scales); the plain rule is float only
FLOAT_CONV = ("float32", "float16", "bfloat16")


def expected_unit(hcd, dtype):
    """From the HCD's fields directly: the unit named for the dtype, bf16 falling back to fp16."""
    listed = [d.removeprefix("torch.") for d in hcd.tensor.supported_dtypes]
    if dtype not in listed and not (dtype == "bfloat16" and hcd.constraints.bfloat16_emulation):
        return None
    if getattr(hcd.compute_units, UNIT[dtype]) is not None:
        return UNIT[dtype]
    if dtype == "bfloat16" and hcd.compute_units.fp16 is not None:
        return "fp16"
    return None


def expected_layouts(hcd, unit):
    own = getattr(hcd.compute_units, unit).supported_layouts
    if own:
        return list(own)
    seen = [hcd.tensor.default_layout]
    for u in ("fp16", "bf16", "fp32", "int8"):
        for lay in (getattr(hcd.compute_units, u).supported_layouts or []) if getattr(hcd.compute_units, u) else []:
            if lay not in seen:
                seen.append(lay)
    return seen


def conv_call(n=1, c=8, heads=None, dtype="float16"):
    x = TensorMeta((n, c, 16, 16), dtype)
    w = TensorMeta((16, c, 3, 3), dtype)
    return Call((x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))


@pytest.mark.parametrize("name", sorted(CHIPS))
def test_convolution_dtypes_and_layouts_follow_the_hcd(name):
    hcd = CHIPS[name]
    report = chip_ops(hcd, CORE)
    conv = next((o for o in report["ops"] if o["op"] == "aten.convolution.default"), None)
    want = {d: expected_unit(hcd, d) for d in FLOAT_CONV}
    want = {d: u for d, u in want.items() if u}
    assert conv is not None
    assert sorted(conv["dtypes"]) == sorted(want)
    for serve in conv["serves"]:
        assert serve["unit"] == want[serve["dtype"]]
        assert serve["layouts"] == expected_layouts(hcd, serve["unit"])
    for dtype in CONV_DTYPES:
        for layout in ("NCHW", "NHWC", "NHCW", "NCWH"):
            m = match(CORE, hcd, "aten.convolution.default", conv_call(dtype=dtype), layout=layout)
            unit = want.get(dtype)
            ok = unit is not None and layout in expected_layouts(hcd, unit)
            assert m.ok == ok, (name, dtype, layout, m)
            if not ok and unit is not None:
                assert f"layout {layout} not in" in str(m) and f"of {hcd.chip.name} {hcd.chip.version}" in str(m)
            if unit is None and dtype != "int8":
                assert "tensor.supported_dtypes" in str(m) or "no compute unit runs" in str(m)
            if dtype == "int8":
                assert not m.ok and "int8" in str(m)


@pytest.mark.parametrize("name", sorted(CHIPS))
@pytest.mark.parametrize("heads", [1, 2, 4, 8, 12, 16, 32])
def test_attention_heads_and_sequence_follow_the_attention_unit(name, heads):
    hcd = CHIPS[name]
    att = hcd.compute_units.attention
    for seq in (16, 300, 1000, 3000):
        q = TensorMeta((1, heads, seq, 64), "float16")
        call = Call((q, q, q))
        m = match(CORE, hcd, "aten.scaled_dot_product_attention.default", call)
        limit = att.max_sequence_length if att and att.max_sequence_length else 1 << 62
        ok = bool(att and att.enabled and heads in (att.supported_heads or []) and seq <= limit
                  and seq <= hcd.constraints.max_sequence_length)
        assert m.ok == ok, (name, heads, seq, str(m))
        if not ok:
            text = str(m)
            if att is None:
                assert "compute_units.attention is absent" in text
            elif heads not in att.supported_heads:
                assert f"query.shape[1] = {heads}" in text and "supported_heads = [" in text
            else:
                assert "sequence longer than" in text


def test_fp32_only_where_the_chip_lists_it_and_has_a_unit():
    for name, hcd in CHIPS.items():
        x = TensorMeta((4, 8), "float32")
        m = match(CORE, hcd, "aten.relu.default", Call((x,)))
        assert m.ok == (expected_unit(hcd, "float32") == "fp32"), name
        if not m.ok:
            assert "dtype float32 not in tensor.supported_dtypes" in str(m)


def test_bfloat16_emulation_runs_on_fp16_and_says_why():
    hcd = CHIPS["NPU-E1"]
    m = match(CORE, hcd, "aten.convolution.default", conv_call(dtype="bfloat16"), layout="NCHW")
    assert m.ok and m.unit == "fp16"
    assert any("bfloat16_emulation is true" in w for w in m.warnings)
    v2 = match(CORE, CHIPS["NPU-V2"], "aten.convolution.default", conv_call(dtype="bfloat16"), layout="NCHW")
    assert v2.ok and v2.unit == "fp16" and any("no bf16 unit" in w for w in v2.warnings)


def test_disabled_attention_unit_is_named():
    text = (bundled_path("hcd_registry") / "npu_v3.hcd").read_text().replace("enabled: true", "enabled: false")
    hcd = load_hcd_text(text, "v3-off.hcd")
    q = TensorMeta((1, 8, 16, 64), "float16")
    m = match(CORE, hcd, "aten.scaled_dot_product_attention.default", Call((q, q, q)))
    assert not m.ok and "compute_units.attention.enabled is false on NPU-V3 1.0.0" in str(m)
    assert m.reasons[0].field == "compute_units.attention.enabled" and m.reasons[0].value is False


PACK = """\
pack: {name: extra, version: 0.1.0}
rules:
  - op: aten.relu.default
    kernel: relu
    args: {self: tensor}
    requires: {device_types: [npu_v3], layouts: chip}
    bind: {a: self}
  - op: aten.tanh.default
    kernel: tanh
    args: {self: tensor}
    requires: {layouts: chip}
    guards: ["chip.memory.on_chip_cache.size_kb >= 2048", "self.rank <= chip.tensor.max_rank"]
    bind: {a: self}
"""


def test_device_type_restriction_and_chip_only_guards():
    pack = load_pack_text(PACK, "extra.yaml")
    for name, hcd in CHIPS.items():
        ops = {o["op"]: o for o in chip_ops(hcd, pack)["ops"]}
        assert ("aten.relu.default" in ops) == (hcd.chip.device_type == "npu_v3"), name
        assert ("aten.tanh.default" in ops) == (hcd.memory.on_chip_cache.size_kb >= 2048), name
        if "aten.tanh.default" in ops:
            assert ops["aten.tanh.default"]["serves"][0]["guards"] == ["self.rank <= chip.tensor.max_rank"]
    m = match(pack, CHIPS["NPU-V2"], "aten.relu.default", Call((TensorMeta((2, 2), "float16"),)))
    assert "chip.device_type npu of NPU-V2 2.1.0 is not in [npu_v3]" in str(m)
    m = match(pack, CHIPS["DSP-M4"], "aten.tanh.default", Call((TensorMeta((2, 2), "float16"),)))
    assert "chip.memory.on_chip_cache.size_kb = 1024" in str(m)
    big = TensorMeta((1,) * 7, "float16")
    m = match(pack, CHIPS["NPU-V3"], "aten.tanh.default", Call((big,)))
    assert "self.rank = 7" in str(m) and "chip.tensor.max_rank = 6" in str(m)


def test_match_binds_kernel_inputs_and_attrs_keeping_the_callers_objects():
    call = conv_call()
    m = match(CORE, CHIPS["NPU-V3"], "aten.convolution.default", call, layout="NHCW")
    assert m.ok and m.kernel == "conv2d" and m.layout == "NHCW" and m.dtype == "float16"
    assert m.inputs["x"] is call.args[0] and m.inputs["weight"] is call.args[1] and m.inputs["bias"] is None
    assert m.attrs["stride"] == [1, 1] and m.attrs["padding"] == [1, 1] and m.attrs["groups"] == 1
    assert m.layouts == ("NCHW", "NHWC", "NHCW")


def test_kwargs_defaults_and_bad_arity():
    x = TensorMeta((2, 3, 8, 8), "float16")
    m = match(CORE, CHIPS["NPU-V3"], "aten.max_pool2d_with_indices.default", Call((x, [2, 2])), layout="NCHW")
    assert m.ok and m.attrs["stride"] == [2, 2] and m.attrs["return_indices"] is True
    m = match(CORE, CHIPS["NPU-V3"], "aten.gelu.default", Call((x,), {"approximate": "tanh"}))
    assert m.ok and m.attrs["approximate"] == "tanh"
    m = match(CORE, CHIPS["NPU-V3"], "aten.relu.default", Call((x, x)))
    assert not m.ok and m.reasons[0].code == "args" and "2 positional arguments" in str(m)
    m = match(CORE, CHIPS["NPU-V3"], "aten.relu.default", Call((x,), {"inplace": True}))
    assert not m.ok and "inplace=" in str(m)


def test_a_python_number_standing_for_a_tensor_binds_the_scalar_attr():
    x = TensorMeta((2, 3), "float16")
    m = match(CORE, CHIPS["NPU-V3"], "aten.mul.Tensor", Call((x, 0.5)))
    assert m.ok and m.inputs["b"] is None and m.attrs["scalar"] == 0.5
    m = match(CORE, CHIPS["NPU-V3"], "aten.mul.Tensor", Call((x, x)))
    assert m.ok and m.inputs["b"] is x and m.attrs["scalar"] == 1
    m = match(CORE, CHIPS["NPU-V3"], "aten.div.Tensor", Call((x, 0)))
    assert not m.ok and "division by a zero scalar" in str(m)


def test_guard_failures_name_the_rule_and_the_guard():
    x = TensorMeta((1, 8, 16, 16), "float16")
    w = TensorMeta((16, 8, 3, 3), "float16")
    m = match(CORE, CHIPS["NPU-V3"], "aten.convolution.default",
              Call((x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1)), layout="NCHW")
    assert not m.ok
    r = m.reasons[0]
    assert r.code == "guard" and r.guard == "not transposed" and r.rule.startswith("core:rules[0]")
    assert "transposed convolution has no kernel" in r.message


def test_no_rule_reasons():
    m = match(CORE, CHIPS["NPU-V3"], "aten.native_dropout.default", Call())
    assert not m.ok and "no dropout kernel" in str(m)
    m = match(CORE, CHIPS["NPU-V3"], "aten.convolutoin.default", Call())
    assert "similar ops with rules: aten.convolution.default" in str(m)
    # suggestions only when similar: not every op that shares "aten." and ".default"
    m = match(CORE, CHIPS["NPU-V3"], "aten.logical_not.default", Call())
    assert "similar ops" not in str(m)
    m = match(CORE, CHIPS["NPU-V3"], "aten.add.out", Call())
    assert "similar ops with rules: aten.add." in str(m)


def test_candidates_lists_every_rule():
    grad = TensorMeta((1, 16, 8, 8), "float16")
    x = TensorMeta((1, 8, 8, 8), "float16")
    w = TensorMeta((16, 8, 1, 1), "float16")
    call = Call((grad, x, w, [16], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False]))
    out = candidates(CORE, CHIPS["NPU-V3"], "aten.convolution_backward.default", call, layout="NCHW")
    assert [m.kernel for m in out if m.ok] == ["conv2d_backward_input", "conv2d_backward_weight"]
    assert out[1].attrs["weight_shape"] == [16, 8, 1, 1] and out[1].attrs["bias_grad"] is False


def test_fusion_match_with_commutative_operand():
    fusion = next(f for f in CORE.fusions if f.name == "conv_add_relu")
    hcd = CHIPS["NPU-V3"]
    conv = conv_call(c=16)
    conv_out = TensorMeta((1, 16, 16, 16), "float16")
    conv = Call(conv.args, out=conv_out)
    residual = TensorMeta((1, 16, 16, 16), "float16")
    add = Call((residual, conv_out))  # add(identity, conv(x)): conv arrives as `other`
    relu = Call((TensorMeta((1, 16, 16, 16), "float16"),))
    m = match_fusion(fusion, hcd, {"conv": conv, "add": add, "act": relu}, layout="NHCW", swaps=(("add", "self", "other"),))
    assert m.ok and m.kernel == "conv2d_add_relu" and m.inputs["residual"] is residual
    bad = Call((residual, conv_out), {"alpha": 2})
    m = match_fusion(fusion, hcd, {"conv": conv, "add": bad, "act": relu}, layout="NHCW", swaps=(("add", "self", "other"),))
    assert not m.ok and "add.alpha == 1" in str(m)
    m = match_fusion(fusion, CHIPS["NPU-V2"], {"conv": conv, "add": add, "act": relu}, layout="NHCW")
    assert not m.ok and "layout NHCW not in compute_units.fp16.supported_layouts [NCHW, NHWC] of NPU-V2" in str(m)


def test_views_of_index_data_need_no_storage_dtype_copies_take_the_index_path():
    """requires.storage: false -- a reshape moves no bytes, so int64 token ids already on
    the device may be viewed on a chip that lists no int64; a copy (slice) of index data
    runs on the chip's index path (requires.index), said in a warning; a float dtype the
    chip does not list is still refused."""
    hcd = CHIPS["NPU-V3"]
    ids = TensorMeta((1, 32), "int64")
    m = match(CORE, hcd, "aten.view.default", Call((ids, [-1, 32])))
    assert m.ok and m.kernel == "reshape" and m.dtype == "int64"
    r = match(CORE, hcd, "aten.slice.Tensor", Call((ids, 1, 0, 16)))
    assert r.ok and any("int64 index math and masks run on the index path of NPU-V3" in w for w in r.warnings)
    r = match(CORE, hcd, "aten.slice.Tensor", Call((TensorMeta((1, 32), "float32"), 1, 0, 16)))
    assert not r.ok and any("float32 not in tensor.supported_dtypes" in str(x) for x in r.reasons)


def test_split_with_sizes_maps_to_the_split_kernel():
    qkv = TensorMeta((1, 32, 3 * 64), "float16")
    m = match(CORE, CHIPS["NPU-V3"], "aten.split_with_sizes.default", Call((qkv, [64, 64, 64], 2)))
    assert m.ok and m.kernel == "split" and m.attrs["sizes"] == [64, 64, 64] and m.attrs["dim"] == 2
