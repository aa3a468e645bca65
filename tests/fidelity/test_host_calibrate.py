"""tools/calibrate.py's planner-choice score: per step, is the chosen call within 10 % of the
fastest measured call that does the same work (partial covers left out)?"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("calibrate", Path(__file__).resolve().parents[2] / "tools" / "calibrate.py")
calibrate = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(calibrate)


STEP = ["conv", "bn", "relu"]


def _pt(step, label, kernel, measured, cover=STEP, layouts=("NCHW",), nodes=STEP):
    return {"case": "c", "step": step, "label": label, "kernel": kernel, "measured_s": measured,
            "cover": sorted(cover), "step_nodes": sorted(nodes), "whole_step": set(cover) >= set(nodes),
            "layouts_in": list(layouts)}


def test_choice_counts_right_and_wrong_steps():
    points = [
        # step 1: the fused call within 10 % of its NHWC twin; the parts alone sum to more
        _pt(1, "chosen", "conv2d_bn_relu", 1.05), _pt(1, "conv2d_bn_relu", "conv2d_bn_relu", 1.0, layouts=("NHWC",)),
        _pt(1, "conv2d", "conv2d", 0.9, cover=["conv"]), _pt(1, "batch_norm_infer", "batch_norm_infer", 0.2,
                                                             cover=["bn"]),
        # step 2: conv2d + bn + relu, each alone, beat the fused call: a wrong choice
        _pt(2, "chosen", "conv2d_bn_relu", 2.0), _pt(2, "conv2d", "conv2d", 1.0, cover=["conv"]),
        _pt(2, "conv2d_bn", "conv2d_bn", 1.5, cover=["conv", "bn"]),
        _pt(2, "batch_norm_infer", "batch_norm_infer", 0.3, cover=["bn"]),
        _pt(2, "relu", "relu", 0.2, cover=["relu"]),
        # step 3: a part without the rest: no exact partition, no alternative
        _pt(3, "chosen", "conv2d_bn_relu", 1.0), _pt(3, "conv2d", "conv2d", 0.5, cover=["conv"]),
    ]
    res = calibrate.choice(points)
    assert res["steps"] == 2 and res["right"] == 1 and res["share"] == pytest.approx(0.5)
    assert res["steps_with_one_point"] == 1
    wrong = [s for s in res["per_step"] if not s["right"]]
    assert wrong[0]["step"] == 2 and wrong[0]["chosen_over_fastest"] == pytest.approx(2.0 / 1.5)
    assert wrong[0]["fastest"].count("+") == 2         # conv2d + batch_norm_infer + relu


def test_host_cases_plan_float32_on_the_host():
    zoo, kw, chip, precision = calibrate.CASES["host_resnet50_b1"]
    assert chip is None and precision is None and zoo == "resnet50"
    with pytest.raises(ValueError, match="--hcd"):
        calibrate.calibrate_case("host_resnet50_b1", 1, 1)
