"""rules/core.yaml itself: checks cleanly, is chip-agnostic, and agrees with ATen's own schemas."""

from __future__ import annotations

import re

import pytest

from torchfl.hcd import load_hcd
from torchfl.resources import bundled_hcds, bundled_path
from torchfl.rules import check_pack
from torchfl.rules import kernels as K

CORE = bundled_path("rules") / "core.yaml"


def test_core_pack_checks_without_any_diagnostic():
    report = check_pack(CORE)
    assert report.ok and report.diagnostics == []
    pack = report.pack
    assert pack.name == "core" and re.fullmatch(r"\d+\.\d+\.\d+", pack.version)
    assert len(pack.rules) >= 70 and len(pack.fusions) >= 7


def test_core_pack_names_no_chip():
    text = CORE.read_text()
    for p in bundled_hcds():
        hcd = load_hcd(p)
        assert hcd.chip.name not in text and f"device_types: [{hcd.chip.device_type}" not in text
    assert "device_types" not in check_pack(CORE).pack.canonical_json().replace('"device_types":null', "")


def test_fusion_patterns_cover_the_required_chains():
    pack = check_pack(CORE).pack
    chains = {tuple(s.ops[0] for s in f.steps): f.kernel for f in pack.fusions}
    conv = "aten.convolution.default"
    want = {
        (conv, "aten._native_batch_norm_legit_no_training.default", "aten.relu.default"): "conv2d_bn_relu",
        (conv, "aten.relu.default"): "conv2d_relu",
        (conv, "aten.add.Tensor", "aten.relu.default"): "conv2d_add_relu",
        (conv, "aten._native_batch_norm_legit_no_training.default", "aten.add.Tensor", "aten.relu.default"):
            "conv2d_bn_add_relu",
        ("aten.linear.default", "aten.gelu.default"): "linear_gelu",
        ("aten.permute.default", "aten.addmm.default", "aten.gelu.default"): "linear_gelu",
        ("aten.linear.default", "aten.relu.default"): "linear_relu",
        ("aten.layer_norm.default", "aten.linear.default"): "layernorm_linear",
        ("aten.bmm.default", "aten.mul.Scalar", "aten._softmax.default", "aten.bmm.default"): "attention",
    }
    for chain, kernel in want.items():
        assert chains.get(chain) == kernel, chain


def test_every_kernel_is_in_the_catalog():
    pack = check_pack(CORE).pack
    used = {r.kernel for r in pack.rules} | {f.kernel for f in pack.fusions}
    assert used <= set(K.kernel_names())
    missing = sorted(used - set(K.catalog()))
    if missing:
        pytest.skip(f"kernels named in docs/ARCHITECTURE.md but not yet in the catalog: {', '.join(missing)}")


ARG_TYPES = {
    "Tensor": {"tensor"}, "Tensor?": {"tensor?"}, "Tensor[]": {"tensor[]"},
    "int": {"int"}, "SymInt": {"int"}, "int?": {"int?"}, "SymInt?": {"int?"},
    "int[]": {"int[]"}, "SymInt[]": {"int[]"}, "int[]?": {"int[]?"}, "SymInt[]?": {"int[]?", "int[]"},
    "float": {"float"}, "float?": {"float?"}, "bool": {"bool"}, "bool?": {"bool?"}, "bool[]": {"bool[]"},
    "str": {"str"}, "str?": {"str?"}, "Scalar": {"scalar"}, "Scalar?": {"scalar?"},
    "ScalarType": {"dtype"}, "ScalarType?": {"dtype?"},
}


def _schema_types(schema) -> dict[str, str]:
    """name -> declared type as the schema string spells it (``ScalarType?``, ``SymInt[]?``), sizes dropped."""
    text = str(schema)
    inner = text[text.index("(") + 1 : text.rindex(") ->")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        depth += ch in "[(" 
        depth -= ch in "])"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = {}
    for part in parts:
        part = part.strip()
        if not part or part == "*":
            continue
        decl = part.split("=")[0].strip()
        typ, name = decl.rsplit(" ", 1)
        typ = re.sub(r"\([a-z!]*(\s*->\s*\*)?\)", "", typ)
        typ = re.sub(r"\[\d+\]", "[]", typ)
        out[name] = typ
    return out


def test_args_match_the_aten_schemas():
    torch = pytest.importorskip("torch")
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the quantized_decomposed ops)
    from torchfl.kernels.grouped.torchop import register

    register()                                   # torchfl.grouped_mm (the catalog may load before torch)
    from torchfl.kernels.ssm.torchop import register as register_ssm

    register_ssm()                               # torchfl.selective_scan, likewise

    pack = check_pack(CORE).pack
    problems = []
    for rule in pack.rules:
        namespace, base, overload = rule.op.split(".")
        schema = getattr(getattr(getattr(torch.ops, namespace), base), overload)._schema
        names = [a.name for a in schema.arguments]
        if list(rule.arg_names()) != names:
            problems.append(f"{rule.id}: args {list(rule.arg_names())} != schema {names}")
            continue
        defaults = dict(rule.defaults)
        declared = _schema_types(schema)
        for arg, (_, spelling) in zip(schema.arguments, rule.args):
            st = declared[arg.name]
            allowed = ARG_TYPES.get(st, {"any"})
            if spelling not in allowed | {"any"}:
                problems.append(f"{rule.id}: {arg.name} declared {spelling}, schema says {st}")
            if arg.name in defaults and arg.default_value is not None:
                want = arg.default_value
                want = list(want) if isinstance(want, (list, tuple)) else want
                if isinstance(want, list) and len(want) == 1 and isinstance(defaults[arg.name], list):
                    want = want * len(defaults[arg.name])  # int[2] x=1 broadcasts
                got = defaults[arg.name]
                if got != want and not (isinstance(got, list) and isinstance(want, int) and set(got) == {want}):
                    problems.append(f"{rule.id}: default {arg.name}={got!r}, schema {want!r}")
    assert not problems, "\n".join(problems)
