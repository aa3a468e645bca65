"""Support queries end to end: bundled HCDs and core.yaml imported into a real SQLite registry."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli
from torchfl.hcd import load_hcd
from torchfl.resources import bundled_hcds, bundled_path
from torchfl.rules import load_pack
from torchfl.rules.support import SupportError, chip_ops, op_support, why_not


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('reg') / 'registry.db'}"
    runner = CliRunner()
    res = runner.invoke(cli, ["registry", "--registry", url, "init", "--no-seed"])
    assert res.exit_code == 0, res.output
    files = [str(p) for p in bundled_hcds()] + [str(bundled_path("rules") / "core.yaml")]
    res = runner.invoke(cli, ["registry", "--registry", url, "import", *files])
    assert res.exit_code == 0, res.output
    return url


def run(url, *args):
    res = CliRunner().invoke(cli, ["registry", "--registry", url, *args])
    return res.exit_code, res.output, getattr(res, "stderr", "")


def run_json(url, *args):
    code, out, _ = run(url, *args, "--json")
    assert code == 0, out
    return json.loads(out)


def test_done_criterion_npu_v3_has_nhcw_npu_v2_does_not(registry):
    v3 = run_json(registry, "ops", "--chip", "NPU-V3")
    conv = next(o for o in v3["ops"] if o["op"] == "aten.convolution.default")
    assert {"NCHW", "NHWC", "NHCW"} <= set(conv["layouts"]) and conv["kernels"] == ["conv2d", "conv1d"]   # 1-D: conv1d
    v2 = run_json(registry, "ops", "--chip", "NPU-V2", "--version", "2.1.0")
    conv2 = next(o for o in v2["ops"] if o["op"] == "aten.convolution.default")
    assert set(conv2["layouts"]) == {"NCHW", "NHWC"}
    why = run_json(registry, "why-not", "aten.convolution.default", "--chip", "NPU-V2", "--layout", "NHCW")
    assert not why["supported"]
    messages = [r["message"] for g in why["gaps"] for r in g["reasons"]]
    assert "layout NHCW not in compute_units.fp16.supported_layouts [NCHW, NHWC] of NPU-V2 2.1.0" in messages
    fp16 = next(g for g in why["gaps"] if g["dtype"] == "float16")
    assert fp16["reasons"][0]["field"] == "compute_units.fp16.supported_layouts"
    assert fp16["reasons"][0]["value"] == ["NCHW", "NHWC"]


def test_ops_json_shape(registry):
    data = run_json(registry, "ops", "--chip", "NPU-V3")
    assert set(data) == {"chip", "packs", "ops", "fusions", "unsupported", "no_rule"}
    assert data["chip"] == {"name": "NPU-V3", "version": "1.0.0", "device_type": "npu_v3"}
    assert data["packs"] == [load_pack(bundled_path("rules") / "core.yaml").label]   # the bundled pack's version
    for o in data["ops"]:
        assert set(o) == {"op", "dtypes", "layouts", "layouts_by_dtype", "kernels", "serves", "evidence"}
        for s in o["serves"]:
            assert set(s) == {"kernel", "rule", "pack", "dtype", "unit", "layouts", "guards", "warnings"}
    names = {f["name"] for f in data["fusions"] if f["supported"]}
    assert {"conv_bn_relu", "conv_relu", "conv_add_relu", "linear_gelu", "linear_relu", "layernorm_linear",
            "attention_decomposed"} <= names
    sdpa = next(o for o in data["ops"] if o["op"] == "aten.scaled_dot_product_attention.default")
    assert any("supported_heads" in g for g in sdpa["serves"][0]["guards"])
    assert any(n["op"] == "aten.native_dropout.default" for n in data["no_rule"])


def test_support_across_chips(registry):
    data = run_json(registry, "support", "aten.scaled_dot_product_attention.default")
    rows = {r["chip"]["name"]: r for r in data["chips"]}
    for p in bundled_hcds():
        hcd = load_hcd(p)
        att = hcd.compute_units.attention
        assert rows[hcd.chip.name]["supported"] == bool(att and att.enabled), hcd.chip.name
    assert "compute_units.attention is absent on DSP-M4 0.9.1" in rows["DSP-M4"]["reasons"][0]["message"]
    code, out, _ = run(registry, "support", "aten.convolution.default")
    assert code == 0 and "NPU-V3 1.0.0" in out and "conv2d" in out


def test_why_not_text_explains_each_gap(registry):
    code, out, _ = run(registry, "why-not", "aten.convolution.default", "--chip", "NPU-V2")
    assert code == 0
    out = " ".join(out.split())      # reasons wrap at the width (100 columns in a pipe): read them as text
    assert "not float16 NHCW: layout NHCW not in compute_units.fp16.supported_layouts [NCHW, NHWC] of NPU-V2 2.1.0" in out
    assert "not float32: dtype float32 not in tensor.supported_dtypes" in out
    assert "served: float16, bfloat16 in NHWC, NCHW" in out and "by conv2d" in out
    assert "not int8" not in out and "int8 in" not in out   # int8 convolution is qconv2d's (quantised fusion)
    code, out, _ = run(registry, "why-not", "aten.native_dropout.default", "--chip", "NPU-V3")
    assert code == 0 and "no dropout kernel" in out
    data = run_json(registry, "why-not", "aten.convolution.default", "--chip", "NPU-V3", "--dtype", "torch.float16",
                    "--layout", "NHCW")
    assert data["supported"] and data["served"][0]["kernel"] == "conv2d" and data["gaps"] == []


@pytest.fixture(scope="module")
def registry_m5(tmp_path_factory):
    """The bundled chips plus DSP-M5: DSP-M4 with a bf16 unit that stores NHWC only."""
    tmp = tmp_path_factory.mktemp("reg5")
    url = f"sqlite:///{tmp / 'registry.db'}"
    src = (bundled_path("hcd_registry") / "dsp_m4.hcd").read_text()
    m5 = src.replace("name: DSP-M4", "name: DSP-M5", 1).replace("device_type: dsp_m4", "device_type: dsp_m5", 1).replace(
        "  int8:", "  bf16:\n    count: 1\n    peak_tflops: 1.0\n    supported_layouts: [NHWC]\n  int8:", 1).replace(
        "supported_dtypes: [torch.float16, torch.int8]", "supported_dtypes: [torch.float16, torch.bfloat16, torch.int8]", 1)
    (tmp / "dsp_m5.hcd").write_text(m5)
    runner = CliRunner()
    assert runner.invoke(cli, ["registry", "--registry", url, "init", "--no-seed"]).exit_code == 0
    files = [str(p) for p in bundled_hcds()] + [str(tmp / "dsp_m5.hcd"), str(bundled_path("rules") / "core.yaml")]
    res = runner.invoke(cli, ["registry", "--registry", url, "import", *files])
    assert res.exit_code == 0, res.output
    return url


def test_layouts_are_per_dtype_not_the_union_across_units(registry_m5):
    # DSP-M5: its fp16 unit stores NHWC and NCHW, its bf16 unit NHWC only
    registry = registry_m5
    data = run_json(registry, "ops", "--chip", "DSP-M5")
    conv = next(o for o in data["ops"] if o["op"] == "aten.convolution.default")
    assert set(conv["layouts_by_dtype"]["float16"]) == {"NHWC", "NCHW"}
    assert conv["layouts_by_dtype"]["bfloat16"] == ["NHWC"]
    code, out, _ = run(registry, "ops", "--chip", "DSP-M5")
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("aten.convolution.default "))
    # the row and the lines its last cell wraps onto (they start under that cell, blank before it)
    cell = [lines[at]] + [ln for ln in lines[at + 1:at + 4] if ln.startswith(" " * 10)]
    assert " ".join(" ".join(cell).split()).endswith("float16 in NHWC, NCHW; bfloat16 in NHWC"), cell
    # columns stay aligned: each column starts at the same place on every op row
    rows = [ln for ln in out.splitlines() if ln.startswith("  aten.") and "  " in ln[2:].rstrip()]
    assert len(rows) > 20
    assert len({len(ln) - len(ln[2:].split("  ", 1)[1].lstrip()) for ln in rows}) == 1
    code, out, _ = run(registry, "support", "aten.convolution.default")
    assert "DSP-M5 0.9.1" in out and "float16 in NHWC, NCHW; bfloat16 in NHWC" in out
    kernel_cols = {ln.index("conv2d") for ln in out.splitlines() if "conv2d" in ln}
    assert len(kernel_cols) == 1, out


def test_why_not_a_supported_combination_is_one_line(registry):
    code, out, _ = run(registry, "why-not", "aten.convolution.default", "--chip", "NPU-V3", "--dtype", "float16",
                       "--layout", "NHWC")
    assert code == 0
    lines = out.strip().splitlines()
    # one sentence (wrapped at the width: its continuation lines are indented), not a report
    assert all(ln.startswith("    ") for ln in lines[1:]), out
    assert " ".join(out.split()).startswith("aten.convolution.default float16 NHWC on NPU-V3 1.0.0: supported, "
                                            "by conv2d on compute_units.fp16")
    # an unsupported combination still lists each reason
    code, out, _ = run(registry, "why-not", "aten.convolution.default", "--chip", "NPU-V3", "--layout", "NCWH")
    assert "not supported" in out.splitlines()[0] and out.count("not float16 NCWH") == 1


@pytest.mark.parametrize("args, fragment", [
    (("ops", "--chip", "NPU-V9"), "no chip named 'NPU-V9'"),
    (("why-not", "aten.convolutoin.default", "--chip", "NPU-V2"), "did you mean aten.convolution.default"),
    (("why-not", "aten.convolution.default", "--chip", "NPU-V2", "--dtype", "flaot16"), "did you mean float16"),
    (("why-not", "aten.convolution.default", "--chip", "NPU-V2", "--layout", "nchw"), "not a permutation"),
    (("support", "aten.nonexistent.default"), "no rule pack mentions op"),
    (("ops", "--chip", "NPU-V2", "--version", "9.9.9"), "has no version 9.9.9"),
])
def test_unknown_names_list_near_matches(registry, args, fragment):
    code, out, err = run(registry, *args)
    assert code == 1
    assert fragment in (out + (err or "")), out


def test_hostile_or_invalid_pack_import_writes_nothing(registry, tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("pack: {name: evil, version: 1.0.0}\nrules:\n  - {op: aten.relu.default, kernel: relu, "
                    "args: {self: tensor}, bind: {a: self}, guards: [\"__import__('os').system('touch x')\"]}\n")
    typo = tmp_path / "typo.yaml"
    typo.write_text("pack: {name: typo, version: 1.0.0}\nrules:\n  - {op: aten.relu.default, kernel: rleu, "
                    "args: {self: tensor}, bind: {a: self}}\n")
    for path, fragment in ((evil, "dunder"), (typo, "nearest: relu")):
        code, out, err = run(registry, "import", str(path))
        assert code == 1 and fragment in out + (err or ""), out
    listing = run_json(registry, "list")
    assert [p["name"] for p in listing["packs"]] == ["core"]


def test_short_op_names_resolve(registry):
    code, out, _ = run(registry, "why-not", "conv2d", "--chip", "NPU-V2")
    assert code == 0 and out.startswith("aten.conv2d.default on NPU-V2 2.1.0")


def test_queries_import_neither_torch_nor_numba(registry):
    code = (
        "import sys\n"
        "from torchfl.cli.main import cli\n"
        f"for args in (['ops','--chip','NPU-V3','--json'], ['support','aten.relu.default'],"
        f" ['why-not','aten.convolution.default','--chip','NPU-V2']):\n"
        f"    try:\n        cli(['registry','--registry',{registry!r}] + args)\n"
        "    except SystemExit as e:\n        assert e.code in (0, None), e.code\n"
        "bad = [m for m in ('torch', 'numba') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_pure_functions_agree_with_the_registry_path(registry):
    packs = [load_pack(bundled_path("rules") / "core.yaml")]
    chips = [load_hcd(p) for p in bundled_hcds()]
    v2 = next(h for h in chips if h.chip.name == "NPU-V2")
    shown = run_json(registry, "ops", "--chip", "NPU-V2")
    assert all(o.pop("evidence") == {"state": "unverified"} for o in shown["ops"])  # nothing ran here
    assert chip_ops(v2, packs) == shown
    assert op_support("aten.relu.default", chips, packs)["rules"] == 1
    with pytest.raises(SupportError, match="unknown dtype"):
        why_not("aten.relu.default", v2, packs, dtype="float99")
    w = why_not("aten.scaled_dot_product_attention.default", v2, packs, dtype="float32")
    assert not w["supported"] and "tensor.supported_dtypes" in w["gaps"][0]["reasons"][0]["message"]
