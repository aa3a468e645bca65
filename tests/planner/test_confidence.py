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

    def strip(d):
        d.pop("sources", None)
        d.pop("provenance", None)
    plan, target = _plan(hcd_variant(chips["A100-SXM4-80GB"], strip), "resnet18", None, image=32)
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
            d.get("provenance", {}).pop(f"execution.{k}", None)
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


def _sourced(hcd, kinds: dict, default: str = "datasheet", fill_sustained: bool = False):
    """``hcd`` as format 1.2: every number it states sourced ``default``, the paths in ``kinds``
    (a prefix matches) with that kind; ``fill_sustained``: state the sustained fractions too."""
    refs = {"datasheet": {"kind": "datasheet", "ref": "vendor datasheet (test)"},
            "microbenchmark": {"kind": "microbenchmark", "benchmark": "launch-latency", "ref": "a launch test"},
            "assumption": {"kind": "assumption", "ref": "class default (test)"}}

    def edit(d):
        d["chip"]["name"] = d["chip"]["name"] + "-SOURCED"
        if fill_sustained:
            for unit in d["compute_units"].values():
                if isinstance(unit, dict) and ("peak_tflops" in unit or "peak_tops" in unit):
                    unit.setdefault("sustained_fraction", 0.8)
            d["memory"]["off_chip_memory"].setdefault("sustained_fraction", 0.9)
    base = hcd_variant(hcd, edit)
    prov = {}
    for path in base.performance_numbers():
        kind = next((k for p, k in kinds.items() if path.startswith(p)), default)
        prov[path] = kind

    def add(d):
        d["sources"] = {k: refs[k] for k in sorted(set(prov.values()))}
        d["provenance"] = prov
    return hcd_variant(base, add)


def test_every_number_an_assumption_gives_share_one(chips):
    from torchfl.planner.confidence import confidence

    hcd = _sourced(chips["A100-SXM4-80GB"], {}, default="assumption", fill_sustained=True)
    assert hcd.format_version == "1.2"
    plan, target = _plan(hcd, "resnet18", None, image=32)
    c = confidence(plan, target)
    assert c.assumption_share == 1.0 and not c.unstated and not c.missing
    assert "execution.launch_overhead_us" in c.assumed


def test_datasheet_chip_with_a_measured_launch_has_nothing_assumed(chips):
    """Datasheet numbers and a launch-latency microbenchmark: share 0. The launch's numbers made
    assumptions instead: the share is exactly the launch term's share of the time."""
    from torchfl.planner.confidence import confidence

    launch = {"execution.launch_overhead_us": "microbenchmark", "execution.matrix_launch_overhead_us": "microbenchmark",
              "execution.graph_launch_overhead_us": "microbenchmark"}
    hcd = _sourced(chips["A100-SXM4-80GB"], launch, fill_sustained=True)
    plan, target = _plan(hcd, "resnet18", None, image=32)
    c = confidence(plan, target)
    assert c.assumption_share == 0.0 and not c.unstated and not c.assumed and not c.missing
    assert c.shares["launch"] > 0.5
    assumed = _sourced(chips["A100-SXM4-80GB"], {k: "assumption" for k in launch}, fill_sustained=True)
    plan, target = _plan(assumed, "resnet18", None, image=32)
    c = confidence(plan, target)
    assert c.assumption_share == pytest.approx(c.shares["launch"], rel=1e-12)
    assert set(c.assumed) == {"execution.launch_overhead_us", "execution.matrix_launch_overhead_us"}
    # a sustained fraction left out: the compute term is unstated, and the number listed as missing
    # (the bundled A100 states every unit's since 1.3.0: drop them here)
    def drop(d):
        for unit in d["compute_units"].values():
            if isinstance(unit, dict):
                unit.pop("sustained_fraction", None)
        d["memory"]["off_chip_memory"].pop("sustained_fraction", None)
        for key in ("sources", "provenance"):
            d.pop(key, None)
    bare = _sourced(hcd_variant(chips["A100-SXM4-80GB"], drop), launch)
    c = confidence(*_plan(bare, "resnet18", None, image=32))
    missing = [p for p in c.missing if p.endswith("sustained_fraction")]
    assert missing and set(missing) <= set(c.unstated) and c.assumption_share > 0
