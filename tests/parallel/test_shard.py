"""One tensor-parallel shard, planned by the single-chip planner (real plans, no mocks)."""

from __future__ import annotations

import pytest

from torchfl.planner.lm import tiny_llama
from torchfl.planner.parallel import ParallelError, ShardError, Split, candidates, parse_chips, shard_config, shard_lm
from torchfl.planner.whatif import Decoder, chip_of, plan_decode


@pytest.fixture(scope="module")
def lm():
    return tiny_llama()[0]


@pytest.fixture(scope="module")
def a100():
    return chip_of("A100-SXM4-80GB")


def _linear_flops(plan) -> float:
    return sum(s.predicted_flops for s in plan.steps if s.kernel == "linear")


def test_tp1_is_the_single_chip_plan(lm, a100):
    assert shard_lm(lm, 1) is lm
    one = plan_decode(a100, Decoder(lm), 1, 64, None)
    same = plan_decode(a100, Decoder(shard_lm(lm, 1)), 1, 64, None)
    assert one.plan.summary.per_call_time_s == same.plan.summary.per_call_time_s


def test_tp2_halves_the_linear_flops_and_the_kv_cache(lm, a100):
    one = plan_decode(a100, dec1 := Decoder(lm), 1, 64, None)
    two = plan_decode(a100, dec2 := Decoder(shard_lm(lm, 2)), 1, 64, None)
    assert one.ok and two.ok
    assert _linear_flops(two.plan) == pytest.approx(_linear_flops(one.plan) / 2)
    assert dec2.cache_bytes(1, 64) * 2 == dec1.cache_bytes(1, 64)


def test_the_shard_keeps_the_head_size_and_hidden(lm):
    cfg = shard_config(lm.config, 2)
    assert cfg.num_attention_heads == 2 and cfg.num_key_value_heads == 1 and cfg.intermediate_size == 64
    assert cfg.head_dim == 16 and cfg.hidden_size == 64 and cfg.vocab_size == 64
    assert lm.config.num_attention_heads == 4          # the original config untouched


def test_kv_heads_fewer_than_tp_are_replicated(lm):
    assert shard_config(lm.config, 4).num_key_value_heads == 1


def test_a_tp_that_does_not_divide_the_heads_is_refused_in_one_line(lm):
    with pytest.raises(ShardError, match="does not divide the attention heads .*num_attention_heads = 4"):
        shard_config(lm.config, 3)


def test_candidates_and_a_fixed_split(lm):
    assert candidates(4, lm.config) == [Split(4, 1), Split(2, 2)]    # pp 4 does not divide 2 layers
    assert candidates(4, lm.config, tp=2) == [Split(2, 2)]
    with pytest.raises(ParallelError, match="--tp 4 x --pp 2 = 8 chips, but --chips gives 4"):
        candidates(4, lm.config, tp=4, pp=2)


def test_chips_are_parsed_or_refused():
    assert parse_chips("8xH100-SXM5-80GB").count == 8 and parse_chips(" 2 X A100 ").chip == "A100"
    with pytest.raises(ParallelError, match="COUNTxCHIP"):
        parse_chips("H100")


def test_a_tp_that_is_not_a_multiple_of_fewer_kv_heads_is_refused():
    """12 query heads, 3 key/value heads, tp 4: chip 1's query heads 3-5 read key/value heads 0 and 1."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=96, num_attention_heads=12, num_key_value_heads=3, intermediate_size=96,
                      vocab_size=96)
    with pytest.raises(ShardError, match="not a multiple of the 3 key/value heads"):
        shard_config(cfg, 4)
