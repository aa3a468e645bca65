"""Decompositions as data: the rule-pack form (located errors), its matching, and the
core pack's attention decomposition (chips without an attention unit only)."""
import pytest

from torchfl.rules.call import Call, TensorMeta
from torchfl.rules.compile import check_pack_text, load_pack_text
from torchfl.rules.decompose import expand

HEAD = """pack: {name: t, version: 1.0.0}
rules:
  - {op: aten.bmm.default, kernel: bmm, args: {self: tensor, mat2: tensor}, requires: {layouts: none},
     bind: {a: self, b: mat2}}
decompositions:
"""

GOOD = HEAD + """  - name: gram
    op: torchfl.gram.default
    args: {x: tensor, scale: "float?"}
    guards: ["x.rank == 3"]
    parts:
      - {id: xt, op: aten.transpose.int, args: [x, 1, 2]}
      - {id: g, op: aten.bmm.default, args: [x, xt]}
      - {id: s, op: aten.mul.Scalar, args: [g, "scale if scale != none else 1.0 / sqrt(x.shape[2])"], when: "x.shape[2] > 1"}
"""


def _errors(text):
    report = check_pack_text(text, "p.yaml")
    assert not report.ok
    return [str(d) for d in report.diagnostics]


def test_good_pack_and_its_parts():
    pack = load_pack_text(GOOD)
    (dec,) = pack.decompositions
    assert dec.id == "t:decompositions[0] gram" and [p.id for p in dec.parts] == ["xt", "g", "s"]
    x = TensorMeta((2, 3, 4), "float16")
    from torchfl.hcd import load_hcd
    from torchfl.resources import bundled_path

    hcd = load_hcd(bundled_path("hcd_registry") / "dsp_m4.hcd")
    parts = expand(dec, hcd, Call(args=(x,), kwargs={}))
    assert [(p.id, p.op) for p in parts] == [("xt", "aten.transpose.int"), ("g", "aten.bmm.default"),
                                             ("s", "aten.mul.Scalar")]
    assert parts[1].args == (x, parts[0]) and parts[2].args[1] == pytest.approx(0.5)
    one = expand(dec, hcd, Call(args=(TensorMeta((2, 3, 1), "float16"),), kwargs={}))
    assert [p.id for p in one] == ["xt", "g"]            # `when` false: s skipped
    refused = expand(dec, hcd, Call(args=(TensorMeta((3, 4), "float16"),), kwargs={}))
    assert not refused and "x.rank == 3" in str(refused)


def test_packs_without_decompositions_keep_their_canonical_form():
    pack = load_pack_text(HEAD.replace("decompositions:\n", ""))
    assert "decompositions" not in pack.canonical()


@pytest.mark.parametrize("part, where, message", [
    ('{id: g, op: aten.bmm.default, args: [x, later]}', "10:49", "unknown name 'later'"),
    ('{id: x, op: aten.bmm.default, args: [x, x]}', "10:14", "part id 'x' is already an argument"),
    ('{id: g, op: torchfl.gram.default, args: [x]}', "10:21", "cannot recurse"),
    ('{id: g, op: aten.bmm.default, args: [x, "x.shape[0] +"]}', "10:62", "expression 'x.shape[0] +'"),
    ('{id: g, op: aten.bmm.default, args: [x], when: "x.rank =="}', "10:66", "when 'x.rank =='"),
    ('{id: g, op: aten.bmm.default, argz: [x]}', "10:39", "unknown field 'argz'"),
    ('{id: g, op: bmm, args: [x]}', "10:21", "op 'bmm' is not valid"),
])
def test_bad_parts_are_located(part, where, message):
    text = HEAD + f"""  - name: gram
    op: torchfl.gram.default
    args: {{x: tensor}}
    parts:
      - {part}
"""
    errors = _errors(text)
    assert any(e.startswith(f"p.yaml:{where}:") and message in e for e in errors), errors


def test_op_without_args_or_rule_is_refused():
    errors = _errors(HEAD + """  - name: gram
    op: torchfl.gram.default
    parts: [{id: g, op: aten.bmm.default, args: []}]
""")
    assert any("p.yaml:7:9:" in e and "has no rule in this pack" in e for e in errors), errors


def test_requires_limited_to_attention():
    errors = _errors(HEAD + """  - name: gram
    op: torchfl.gram.default
    args: {x: tensor}
    requires: {dtypes: [float16]}
    parts: [{id: g, op: aten.bmm.default, args: [x, x]}]
""")
    assert any("p.yaml:9:5:" in e and "only attention:" in e for e in errors), errors


# -- the core pack's attention decomposition -------------------------------------------------
def _core():
    from torchfl.planner.target import bundled_packs

    return bundled_packs()


def _hcd(name):
    from torchfl.hcd import load_hcd
    from torchfl.resources import bundled_hcds

    return next(h for h in map(load_hcd, bundled_hcds()) if h.chip.name == name)


def _sdpa_call(heads=8, kv=2, **kw):
    q, k = TensorMeta((1, heads, 16, 32), "float16"), TensorMeta((1, kv, 16, 32), "float16")
    return Call(args=(q, k, k), kwargs={"enable_gqa": kv != heads, **kw})


def test_core_sdpa_decomposes_only_without_attention_unit():
    from torchfl.rules.decompose import decompositions_for

    (dec,) = decompositions_for(_core(), "aten.scaled_dot_product_attention.default")
    parts = expand(dec, _hcd("DSP-M4"), _sdpa_call(is_causal=True))
    ops = [p.op for p in parts]
    assert ops.count("aten.bmm.default") == 2 and "aten._softmax.default" in ops
    assert "aten.expand.default" in ops and "aten.tril.default" in ops     # GQA repeat, causal mask
    plain = [p.op for p in expand(dec, _hcd("DSP-M4"), _sdpa_call(heads=2))]
    assert "aten.expand.default" not in plain and "aten.tril.default" not in plain
    for chip in ("NPU-V2", "NPU-V3"):
        refused = expand(dec, _hcd(chip), _sdpa_call())
        assert not refused and "compute_units.attention enabled" in str(refused)
    dropout = expand(dec, _hcd("DSP-M4"), _sdpa_call(dropout_p=0.1))
    assert not dropout and "dropout" in str(dropout)


def test_core_masked_fill_scalar_binds_its_value():
    """masked_fill.Scalar filled 0.0 whatever its value (the rule did not bind it)."""
    from torchfl.rules import match

    x, m = TensorMeta((2, 3), "float16"), TensorMeta((2, 3), "bool")
    hit = match(_core(), _hcd("NPU-V3"), "aten.masked_fill.Scalar", Call(args=(x, m, -7.5), kwargs={}))
    assert hit.ok and hit.attrs["scalar"] == -7.5


def test_why_not_lists_the_decomposition_where_the_chip_allows_it():
    from torchfl.rules.support import why_not

    sdpa = "aten.scaled_dot_product_attention.default"
    (d,) = why_not(sdpa, _hcd("DSP-M4"), _core())["decompositions"]
    assert d["rule"].endswith("sdpa_gemm_softmax") and "aten.bmm.default" in d["parts"]
    assert "dropout_p == 0" in d["guards"]
    assert why_not(sdpa, _hcd("NPU-V2"), _core())["decompositions"] == []
