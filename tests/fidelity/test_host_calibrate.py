"""tools/calibrate.py's planner-choice score: per step, is the chosen call within 10 % of the
fastest measured call that does the same work (partial covers left out)?"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("calibrate", Path(__file__).resolve().parents[2] / "tools" / "calibrate.py")
calibrate = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(calibrate)


def _pt(step, label, kernel, measured, whole=True, layouts=("NCHW",)):
    return {"case": "c", "step": step, "label": label, "kernel": kernel, "measured_s": measured,
            "whole_step": whole, "layouts_in": list(layouts)}


def test_choice_counts_right_and_wrong_steps():
    points = [
        _pt(1, "chosen", "conv2d_bn_relu", 1.05), _pt(1, "conv2d_bn_relu", "conv2d_bn_relu", 1.0, layouts=("NHWC",)),
        _pt(1, "conv2d", "conv2d", 0.5, whole=False),           # a partial cover: not the same work
        _pt(2, "chosen", "linear", 2.0), _pt(2, "linear_gelu", "linear_gelu", 1.5),
        _pt(3, "chosen", "add", 1.0),                            # one whole-step point: no choice made
    ]
    res = calibrate.choice(points)
    assert res["steps"] == 2 and res["right"] == 1 and res["share"] == pytest.approx(0.5)
    assert res["steps_with_one_point"] == 1
    wrong = [s for s in res["per_step"] if not s["right"]]
    assert wrong[0]["step"] == 2 and wrong[0]["chosen_over_fastest"] == pytest.approx(2.0 / 1.5)


def test_host_cases_plan_float32_on_the_host():
    zoo, kw, chip, precision = calibrate.CASES["host_resnet50_b1"]
    assert chip is None and precision is None and zoo == "resnet50"
    with pytest.raises(ValueError, match="--hcd"):
        calibrate.calibrate_case("host_resnet50_b1", 1, 1)
