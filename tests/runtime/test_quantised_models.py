"""Quantised models (PT2E, torchao) end to end on NPU-V3's int8 unit, against PyTorch's
quantised reference (the converted model run eagerly: quantized_decomposed ops around
float32 ops) and against the float model.

Tolerances, stated and measured (ResNet-18 at 32x32, a 1-layer BERT of width 64):
- the int8 kernels match the reference within one quantum per int8 output
  (tests/kernels/test_quantised.py); between them the float ops the rules do not fuse
  (pooling, layer norm, attention, GELU) run in float16 under the precision policy, where
  the reference computes in float32, and the graph input is quantised from its float16
  cast. A one-quantum flip early in the network moves later values by a quantum or so, so
  outputs are compared relative to the largest |reference| output: within 5 %
  (measured: ResNet-18 2.3 %, BERT layer 0.8 %).
- accuracy against the float model, the figure a user cares about: the chip's error is
  within 2x of the reference quantised model's own error (measured: ResNet-18 ~1.3x,
  BERT ~1.0x); int8 quantisation, not the chip, dominates.
"""
import warnings

import pytest
import torch

from torchfl.planner.zoo import load_model
from torchfl.runtime.backend import recording

warnings.filterwarnings("ignore", category=FutureWarning)
OPTIONS = {"chip": "NPU-V3", "precision": "float16"}


def _quantised(name, **kw):
    from torchfl.planner.quantise import quantise_pt2e

    model, inputs = load_model(name, **kw)
    return model, quantise_pt2e(model, inputs), inputs


def _first(out):
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else (
        out[0] if isinstance(out, (tuple, list)) else out)


def _run(quantised, inputs):
    compiled = torch.compile(quantised, backend="torchfl", options=OPTIONS)
    with torch.no_grad(), recording() as rec:
        y = _first(compiled(*inputs))
    return y, [p for _cg, p, _r in rec.entries]


def _int8_on_chip(plans, kernels):
    """Zero fallbacks; the quantised groups run as int8 kernels (whose notes give the scales'
    granularity), never as float convolutions or matmuls."""
    assert plans and not [f for p in plans for f in p.fallbacks]
    steps = [s for p in plans for s in p.steps]
    int8 = [s for s in steps if s.kernel in kernels]
    assert int8 and all(s.kind == "fused" and s.dtype == "int8" for s in int8)
    assert all("per-channel" in s.note and "compute_units.int8" in s.note for s in int8 if s.kernel != "qadd")
    assert not [s for s in steps if s.kernel in ("conv2d", "linear", "matmul")]
    return int8


def _compare(y, ref, fl, rel_tol):
    scale = float(ref.abs().max())
    err_ref = float((y.float() - ref).abs().max())
    assert err_ref <= rel_tol * scale, f"chip vs quantised reference: {err_ref:.4g} > {rel_tol} x {scale:.4g}"
    chip_vs_float = float((y.float() - fl).abs().max())
    ref_vs_float = float((ref - fl).abs().max())
    assert chip_vs_float <= 2 * ref_vs_float, (chip_vs_float, ref_vs_float)


def test_quantised_resnet18_on_npu_v3():
    model, quantised, inputs = _quantised("resnet18", image=32)
    y, plans = _run(quantised, inputs)
    with torch.no_grad():
        ref, fl = quantised(*inputs), model(*inputs)
    int8 = _int8_on_chip(plans, ("qconv2d", "qadd", "qlinear"))
    assert {s.kernel for s in int8} == {"qconv2d", "qadd", "qlinear"}
    assert len([s for s in int8 if s.kernel == "qconv2d"]) == 20    # every conv (BN folded by PT2E)
    _compare(y, ref, fl, 0.05)


def test_quantised_bert_layer_on_npu_v3():
    model, quantised, inputs = _quantised("bert-base", layers=1, hidden=64, num_heads=4, seq_len=16)
    y, plans = _run(quantised, inputs)
    with torch.no_grad():
        ref, fl = _first(quantised(*inputs)), _first(model(*inputs))
    int8 = _int8_on_chip(plans, ("qlinear", "qadd"))
    assert len([s for s in int8 if s.kernel == "qlinear"]) == 6     # q, k, v, attention out, FFN in/out
    _compare(y, ref, fl, 0.05)


def test_explain_analyze_int8_counted_equals_predicted():
    """explain analyze executes the plan: every int8 step's counted bytes equal its prediction."""
    import torchfl

    _model, quantised, inputs = _quantised("resnet18", image=16)
    compiled = torch.compile(quantised, backend="torchfl", options=OPTIONS)
    with torch.no_grad():
        text, analyses = torchfl.explain(compiled, *inputs, analyze=True, return_analysis=True)
    steps = [s for an in analyses for s in an.steps]
    int8 = [s for s in steps if s.kernel in ("qconv2d", "qadd", "qlinear")]
    assert len(int8) == 29 and all(s.bytes_match and s.measured_bytes > 0 for s in int8)
    assert all(s.bytes_match for s in steps)
    text = " ".join(text.split())      # notes wrap at the width: read them as sentences
    assert "0 fallbacks" in text and "weight per-channel" in text


def test_chip_without_int8_refuses_a_quantised_graph():
    """The article's kind of error, before anything runs, naming the supported dtypes."""
    import json

    from torchfl.hcd import load_hcd_text
    from torchfl.planner import plan_module
    from torchfl.planner.errors import HardConstraintError
    from torchfl.hcd import load_hcd
    from torchfl.resources import bundled_hcds

    hcd = next(h for h in map(load_hcd, bundled_hcds()) if h.chip.name == "NPU-V3")
    data = json.loads(hcd.canonical_json())
    data["compute_units"].pop("int8")
    data["tensor"]["supported_dtypes"] = [d for d in data["tensor"]["supported_dtypes"] if d != "torch.int8"]
    no_int8 = load_hcd_text(json.dumps(data), "npu-v3-no-int8.hcd")
    _model, quantised, inputs = _quantised("mlp", batch=2, width=32, depth=1)
    with pytest.raises(HardConstraintError, match=r"dtype torch\.int8 not supported on NPU-V3") as err:
        plan_module(quantised, inputs, chip=no_int8, precision="float16")
    assert "torch.float16" in str(err.value) and err.value.field == "tensor.supported_dtypes"
