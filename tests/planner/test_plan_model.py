"""The Plan data model round-trips through JSON and serialises deterministically."""

from torchfl.planner.plan import (Conversion, Fallback, Plan, PlanInput, Rejected, Step, Summary,
                                  Value, identity_layout)


def _plan():
    step = Step(index=0, kind="kernel", kernel="relu", nodes=("relu",), ops=("aten.relu.default",),
                inputs=("x",), outputs=("relu",), layouts_in=("NCHW",), layout_out="NCHW",
                dtype="float16", tile={"strategy": "resident"}, attrs={"k": [1, 2]},
                predicted_flops=8.0, predicted_bytes=32.0, predicted_time_s=1e-9)
    return Plan(chip="NPU-V3", chip_version="1.0.0", precision="float16",
                inputs=(PlanInput("x", "input", 0, (1, 2, 2, 2), "float16", "NCHW"),),
                outputs=("relu",),
                values={"x": Value("x", (1, 2, 2, 2), "float16", "NCHW", None),
                        "relu": Value("relu", (1, 2, 2, 2), "float16", "NCHW", 0)},
                steps=(step,), conversions=(Conversion(0, "x", "NCHW", "NHWC", "relu"),), casts=(),
                fallbacks=(Fallback("n", "aten.foo.default", "no rule"),),
                rejected=(Rejected(("relu",), "gelu", ("guard failed",)),),
                summary=Summary(1, 1, 1, 0, 0, 0, 1, 8.0, 32.0, 1e-9))


def test_json_round_trip_is_identical():
    plan = _plan()
    text = plan.to_json()
    again = Plan.from_json(text)
    assert again == plan
    assert again.to_json() == text


def test_headline_text():
    assert _plan().summary.headline("NPU-V3") == (
        "1 of 1 nodes on NPU-V3 in 1 kernels (0 fused groups), 0 layout conversions, 1 fallbacks to CPU")


def test_identity_layouts():
    assert identity_layout(4) == "NCHW"
    assert identity_layout(2) == "AB"
    assert len(set(identity_layout(7))) == 7
