"""The split priced and chosen: a real tiny LLaMA planned over 2 and 4 chips of a real HCD."""

from __future__ import annotations

import pytest

from torchfl.planner.lm import tiny_llama
from torchfl.planner.parallel import ParallelError, all_reduce_s, plan_parallel
from torchfl.planner.whatif import chip_of


@pytest.fixture(scope="module")
def lm():
    return tiny_llama()[0]


def test_the_decode_step_is_the_stages_plus_their_collectives(lm):
    h100 = chip_of("H100-SXM5-80GB")
    r = plan_parallel(lm, h100, 2, batch=1, context=64, prompt=8, precision=None)
    assert r["ok"] and r["chosen_by"] == "cost" and r["fabric"] == "nvswitch"
    best = r["rows"][0]
    assert best["decode_s"] == pytest.approx(best["compute_s"] + best["collective_s"])
    assert best["compute_s"] == pytest.approx(best["pp"] * best["stage_s"])
    if best["tp"] == 2:
        # 2 all-reduces per layer and one after the embedding, of batch x hidden float32 values
        assert best["all_reduces"] == 2 * 2 + 1 and best["all_reduce_bytes"] == 64 * 4
        assert best["all_reduce_s"] == pytest.approx(5 * all_reduce_s(256, 2, h100.hcd.interconnect))
    assert best["prefill_s"] > 0 and 0 < best["collective_share"] < 1
    assert {(x["tp"], x["pp"]) for x in r["rows"]} == {(2, 1), (1, 2)}
    assert r["rows"][0]["decode_s"] == min(x["decode_s"] for x in r["rows"] if x["ok"])


def test_a_fixed_split_is_planned_alone(lm):
    r = plan_parallel(lm, chip_of("A100-SXM4-80GB"), 4, context=64, precision=None, tp=2, pp=2)
    assert r["chosen_by"] == "user" and r["split"] == {"tp": 2, "pp": 2, "ep": 1} and len(r["rows"]) == 1
    assert r["rows"][0]["layers_per_stage"] == 1 and r["rows"][0]["p2p_s"] > 0


def test_a_chip_without_links_or_too_many_chips_is_refused(lm):
    with pytest.raises(ParallelError, match="states no interconnect"):
        plan_parallel(lm, chip_of("NPU-V3"), 2, context=64)
    with pytest.raises(ParallelError, match="exceed A100-SXM4-80GB's fabric domain of 8"):
        plan_parallel(lm, chip_of("A100-SXM4-80GB"), 16, context=64)


def test_the_two_plan_estimate_equals_the_full_plan_for_identical_layers():
    """The split search prices each candidate from its shard's 1- and 2-layer plans: a decode step's
    time is affine in its identical layers, so the estimate equals the full plan's time."""
    from torchfl.planner.lm import llama
    from torchfl.planner.parallel.split import Split, _decode_split, _estimate_split
    from torchfl.planner.whatif.serving import Engine

    lm4 = llama("tiny")[0]                  # 4 layers, float16, meta
    a100 = chip_of("A100-SXM4-80GB")
    for split in (Split(2, 1), Split(1, 2)):
        est = _estimate_split(lm4, a100, split, 1, 64, None, Engine())
        full = _decode_split(lm4, a100, split, 1, 64, None, Engine())
        assert est["estimated"] and not full["estimated"]
        assert est["decode_s"] == pytest.approx(full["decode_s"], rel=1e-9)
        assert est["peak_bytes"] == pytest.approx(full["peak_bytes"], rel=0.05)


def test_the_chosen_split_is_planned_in_full_the_others_estimated(lm):
    r = plan_parallel(lm, chip_of("A100-SXM4-80GB"), 2, context=64, precision=None)
    assert r["rows"][0]["estimated"] is False and all(x["estimated"] for x in r["rows"][1:])
