"""Planning PT2E-quantised graphs: int8 groups priced on the int8 unit, laid out in that
unit's layouts, explained with their scales' granularity; the support queries answer for
int8; a chip without int8 refuses (tests/runtime/test_quantised_models.py runs them)."""
import warnings

import pytest

from tests.planner.planner_helpers import capture_of, hcd_variant
from torchfl.planner.api import plan_captured
from torchfl.planner.target import Target

warnings.filterwarnings("ignore", category=FutureWarning)


def _quantised_resnet():
    from torchfl.planner.quantise import quantise_pt2e
    from torchfl.planner.zoo import load_model

    model, inputs = load_model("resnet18", image=32)
    return capture_of(quantise_pt2e(model, inputs), inputs, "resnet18-int8-32")


def test_int8_groups_are_priced_with_the_int8_units_peak(chips, packs):
    from torchfl.kernels.chip import ChipModel

    hcd = chips["NPU-V3"]
    cap, x = _quantised_resnet()
    plan = plan_captured(cap, x, Target.of(hcd, packs), precision="float16")
    assert not plan.fallbacks
    chip = ChipModel.from_hcd(hcd)
    assert chip.peak["int8"] == pytest.approx(51.2e12) and chip.peak["int8"] != chip.peak["float16"]
    steps = [s for s in plan.steps if s.kernel == "qconv2d"]
    assert len(steps) == 20
    for s in steps:
        assert s.kind == "fused" and s.dtype == "int8"
        assert s.nodes[-1].startswith("quantize_per_tensor") or s.nodes[-1].startswith("relu")
    # the roofline per tile, max(ops / peak, bytes / bandwidth), takes the int8 unit's peak:
    # with an int8 unit 100x slower (fp16 unchanged) every int8 step is priced at least its
    # ops at that peak, which the fp16 rate (or the memory time) would undercut many times
    slow = hcd_variant(hcd, lambda d: d["compute_units"]["int8"].update(peak_tops=0.512))
    slow_chip = ChipModel.from_hcd(slow)
    slow_plan = plan_captured(cap, x, Target.of(slow, packs), precision="float16")
    for s in (s for s in slow_plan.steps if s.kernel in ("qconv2d", "qadd", "qlinear")):
        # (at the lanes the tiling fills: tiling.vector_utilisation; 1 unless the step says less)
        compute = s.predicted_flops / (slow_chip.peak["int8"] * s.tile.get("compute_util", 1.0))
        memory = s.predicted_bytes / slow_chip.offchip_bw
        assert compute * 0.999 <= s.predicted_time_s <= (compute + memory) * 1.001, s.kernel
        assert compute > 5 * s.predicted_flops / slow_chip.peak["float16"]


def test_int8_groups_take_the_int8_units_layouts(chips, packs):
    """DSP-M4's int8 unit and fp16 unit list different layouts: the int8 convolutions run in
    the int8 unit's, the float ops around them in the fp16 unit's."""
    hcd = hcd_variant(chips["NPU-V3"], lambda d: d["compute_units"]["int8"].update(supported_layouts=["NHWC"]))
    cap, x = _quantised_resnet()
    plan = plan_captured(cap, x, Target.of(hcd, packs), precision="float16")
    convs = [s for s in plan.steps if s.kernel == "qconv2d"]
    assert convs and all(s.layout_out == "NHWC" and s.layouts_in[0] == "NHWC" for s in convs)
    rejected = [r for r in plan.rejected if r.kernel == "qconv2d" and any("compute_units.int8.supported_layouts"
                                                                          in why for why in r.reasons)]
    assert rejected, "the other layouts are rejected citing the int8 unit's layouts"
    assert not plan.fallbacks


def test_explain_shows_int8_steps_with_their_scales_granularity(chips, packs):
    cap, x = _quantised_resnet()
    plan = plan_captured(cap, x, Target.of(chips["NPU-V3"], packs), precision="float16")
    # the notes wrap at the width (100 columns in a pipe): read them as the sentences they are
    text = " ".join(plan.explain("text").split())
    assert "0 fallbacks" in text
    assert "weight per-channel (64 scales" in text and "x per-tensor (scale" in text
    assert "out requantised per-tensor" in text and "out dequantised to float16" not in text  # fc is requantised
    assert "int8 quantise per-tensor" in text and "int8 dequantise per-tensor" in text


def test_support_queries_answer_for_int8(chips, packs):
    from torchfl.rules.support import chip_ops, why_not

    v3 = chips["NPU-V3"]
    ops = chip_ops(v3, packs)
    dq = next(o for o in ops["ops"] if o["op"] == "quantized_decomposed.dequantize_per_tensor.default")
    assert dq["dtypes"] == ["int8"]
    qconv = [f for f in ops["fusions"] if f["kernel"] == "qconv2d"]
    assert qconv and all(f["supported"] and f["dtypes"] == ["int8"] for f in qconv)
    assert any("(into conv.weight)" in op for f in qconv for step in f["pattern"] for op in step)
    no_int8 = hcd_variant(v3, lambda d: (d["compute_units"].pop("int8"), d["tensor"].update(
        supported_dtypes=[t for t in d["tensor"]["supported_dtypes"] if t != "torch.int8"])))
    gaps = why_not("quantized_decomposed.dequantize_per_tensor.default", no_int8, packs, dtype="int8")
    assert not gaps["supported"]
    assert any("not in tensor.supported_dtypes" in r["message"] for g in gaps["gaps"] for r in g["reasons"])
    fus = [f for f in chip_ops(no_int8, packs)["fusions"] if f["kernel"] == "qconv2d"]
    assert fus and not any(f["supported"] for f in fus)


def test_quantising_prints_no_import_noise():
    """A fresh process that quantises (as `torchfl plan impact --models zoo` does) writes
    nothing to stderr: torchao's import logs a warning per CUDA extension a CPU build lacks."""
    import subprocess
    import sys

    code = ("import torch\nfrom torchfl.planner.quantise import quantise_pt2e\n"
            "m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())\n"
            "quantise_pt2e(m, (torch.randn(1, 3, 8, 8),))\nprint('done')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "done", run.stderr
    assert "Failed to load" not in run.stderr and "Enum subclass" not in run.stderr, run.stderr
