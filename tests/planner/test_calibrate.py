"""tools/calibrate.py: rank statistics, the rejected alternatives' calls kept in the plan, and
one measured point per alternative on a small model (the figures are in BENCHMARKS.md)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import calibrate  # noqa: E402


def test_ranks_average_ties_and_spearman():
    assert calibrate.ranks([3.0, 1.0, 2.0, 1.0]) == [4.0, 1.5, 3.0, 1.5]
    assert calibrate.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert calibrate.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # textbook value: d = (0, -1, 1, 0, 0) -> 1 - 6*2 / (5*24) = 0.9
    assert calibrate.spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    assert calibrate.spearman([1, 1, 1], [1, 2, 3]) is None
    assert calibrate.spearman([1], [2]) is None


def test_rejected_alternatives_keep_their_call_and_are_measured(tmp_path):
    import torch

    from torchfl.kernels.catalog import get
    from torchfl.kernels.memory import DeviceMemory
    from torchfl.planner.api import plan_module
    from torchfl.planner.memory import static_steps
    from torchfl.planner.plan import Plan

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 16)).eval()
    x = torch.randn(4, 32)
    plan = plan_module(model, (x,), "NPU-V3", precision="float16")
    priced = [r for r in plan.rejected if r.predicted_time_s is not None]
    assert priced and all(r.call.get("kernel") for r in priced if not r.kernel.startswith("cpu"))
    again = Plan.from_dict(plan.to_dict())
    assert [r.call for r in again.rejected] == [r.call for r in plan.rejected]
    calls = calibrate._calls(plan, top=2)
    assert calls and all(pts[0][0] == "chosen" for _s, pts in calls)
    assert any(len(pts) > 1 for _s, pts in calls), "a linear step has priced alternatives (linear alone, other layouts)"
    chip = plan.target.model
    mem = DeviceMemory(chip)
    _st, static_vals = static_steps(plan)
    from torchfl.kernels.tiling import simulated_time

    for _step, pts in calls:
        for _label, call, pred, _nodes in pts:
            assert pred > 0
            seconds, tp = calibrate.measure(plan, call, chip, mem, static_vals, runs=1)
            assert seconds >= 0
            # the point's plan is the one the planner priced: the same formula gives its price back
            assert simulated_time(tp, chip, call["dtype"]) == pytest.approx(pred)
            assert get(call["kernel"]).family
    assert mem.memory_allocated() == 0


def test_summary_reports_ties_steps_and_the_host_balance():
    from torchfl.kernels.chip import ChipModel
    from torchfl.kernels.tiling import TileConfig, Traffic, make_plan

    chip = ChipModel(peak={"float16": 1e12}, offchip_bw=1e9)
    def point(step, pred, meas, flops, nbytes):
        tp = make_plan("k", (), TileConfig("resident"), [(1, Traffic(nbytes, 0, flops))], 0)
        return {"case": "c", "step": step, "family": "matmul", "kernel": "k", "predicted_s": pred, "measured_s": meas,
                "flops": flops, "bytes": nbytes, "_host": (tp, chip, "float16")}
    pts = [point(1, 1.0, 2.0, 10, 1), point(1, 2.0, 4.0, 20, 1), point(1, 3.0, 6.0, 30, 1),
           point(2, 5.0, 1.0, 10, 1), point(2, 5.0, 2.0, 10, 1)]
    host = calibrate.host_balanced(pts)
    assert host["peak_ops_per_s"] == pytest.approx(10.0) and host["offchip_bytes_per_s"] == pytest.approx(1.0)
    assert all("_host" not in p and p["host_predicted_s"] > 0 for p in pts)
    fam = calibrate.summarise(pts)["matmul"]
    assert fam["within_step_spearman"] == pytest.approx(1.0) and fam["within_step_groups"] == 1
    assert fam["tied_points"] == 2 and fam["mae_s"] == pytest.approx((1 + 2 + 3 + 4 + 3) / 5)
    steps = {r["step"]: r for r in fam["steps"]}
    assert steps[1]["spearman"] == pytest.approx(1.0)
    assert steps[2]["spearman"] is None and steps[2]["why_none"] == "all points predicted equal"
