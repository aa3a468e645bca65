"""Confidence of a predicted time (``planner/confidence.py``) and the terms it reads
(``planner/terms.py``), on real plans of zoo models on the bundled chips.

The terms are read again from each step (its tile plan rebuilt and priced by ``time_terms``):
they must add up to the step's predicted time exactly, and the share of the time a chip's
unstated numbers priced is what the provenance says."""

import pytest

from tests.planner.planner_helpers import captured, hcd_variant


def _target(hcd):
    from torchfl.planner.target import Target

    return Target.of(hcd)


def _plan(hcd, model="resnet18", precision=None, **options):
    from torchfl.planner.api import plan_captured

    cap, inputs = captured(model, **options)
    target = _target(hcd)
    return plan_captured(cap, inputs, target, precision=precision), target


@pytest.mark.parametrize("chip,precision", [("A100-SXM4-80GB", None), ("NPU-V3", "float16"), ("GAUDI2", "bfloat16")])
def test_terms_add_up_to_each_step_exactly(chips, chip, precision):
    from torchfl.planner.terms import plan_terms, term_times

    plan, target = _plan(chips[chip], "resnet18", precision, image=32)
    terms = plan_terms(plan, target.model)
    assert terms and all(t.exact for t in terms), [t for t in terms if not t.exact]
    for t in terms:
        assert t.launch_s + t.body_s == pytest.approx(plan.steps[t.index].predicted_time_s, rel=1e-12)
    assert sum(term_times(terms).values()) == pytest.approx(plan.summary.per_call_time_s, rel=1e-9)


def test_launch_bound_where_launches_dominate(chips):
    """Small kernels on a chip with a 12-21 us launch: the launches take most of the time,
    and the bound named is the launch, not "memory, 100%"."""
    from torchfl.planner.terms import plan_terms, term_times
    from torchfl.planner.whatif import bound_resource

    plan, target = _plan(chips["A100-SXM4-80GB"], "mlp", None, width=64, depth=2)
    times = term_times(plan_terms(plan, target.model))
    assert times["launch"] > 0.5 * sum(times.values())
    bound, share = bound_resource(plan, target.model)
    assert bound == "launch" and share == pytest.approx(times["launch"] / sum(times.values()))
    # the same plan on a chip that states no launch cost: bound by its data, not by launches
    plan, target = _plan(chips["NPU-V3"], "mlp", "float16", width=64, depth=2)
    assert bound_resource(plan, target.model)[0] in ("memory", "compute")


def test_unstated_numbers_price_the_whole_time(chips):
    """A format-1.0/1.1 chip states no provenance: every number is unstated, share 1.0."""
    from torchfl.planner.confidence import confidence

    plan, target = _plan(chips["A100-SXM4-80GB"], "resnet18", None, image=32)
    c = confidence(plan, target)
    assert c.assumption_share == 1.0
    assert "execution.matrix_launch_overhead_us" in c.unstated and "execution.launch_overhead_us" in c.unstated
    assert "memory.off_chip_memory.bandwidth_gb_per_s" in c.unstated
    assert sum(c.shares.values()) == pytest.approx(1.0)
    assert c.state == "unknown" and c.checked_rows == 0 and c.out_of_sample_mae is None
    d = c.to_dict()
    assert d["assumption_share"] == 1.0 and set(d) >= {"checked_rows", "out_of_sample_mae", "unstated", "missing"}


def test_missing_launch_is_listed_and_ranked_by_the_peers_cost(chips):
    """A chip whose file leaves the launch cost out prices every launch as nothing: listed in
    ``missing``, and ranked as if it paid the least launch cost a compared chip states."""
    from torchfl.planner.confidence import confidence, rank_time

    a100 = chips["A100-SXM4-80GB"]

    def drop_launch(d):
        d["chip"]["name"] = "A100-NO-LAUNCH"
        for k in ("launch_overhead_us", "matrix_launch_overhead_us", "graph_launch_overhead_us"):
            d["execution"].pop(k, None)
    bare = hcd_variant(a100, drop_launch)
    plan, target = _plan(bare, "mlp", None, width=64, depth=2)
    c = confidence(plan, target)
    assert "execution.launch_overhead_us" in c.missing and c.shares.get("launch", 0.0) == 0.0
    peer = _target(a100)
    kernels = [s for s in plan.steps if not s.static and s.predicted_time_s > 0 and s.kind not in ("fallback", "fold")]
    ranked = rank_time(plan.summary.per_call_time_s, plan, target, [target, peer])
    stated = sum(peer.model.launch_for(s.kernel) for s in kernels)      # matmuls 21 us, the rest 12 us
    assert stated > len(kernels) * peer.model.launch_s
    assert ranked == pytest.approx(plan.summary.per_call_time_s + stated, rel=1e-12)
    # alone (no peer states it), the rank time is its own time; a chip that states its launch keeps its own
    assert rank_time(plan.summary.per_call_time_s, plan, target, [target]) == plan.summary.per_call_time_s
    own, t100 = _plan(a100, "mlp", None, width=64, depth=2)
    assert rank_time(own.summary.per_call_time_s, own, t100, [t100, target]) == own.summary.per_call_time_s
