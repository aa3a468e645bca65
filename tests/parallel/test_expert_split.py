"""Expert parallel as a split the planner prices and chooses (``--ep``): a tiny Mixtral on the meta device.

Each chip of an ep split holds E / ep experts and runs batch / ep sequences; two all-to-alls per MoE
layer, priced by ``planner.parallel.experts``. Fixed splits keep the file fast (one plan each).
"""

from __future__ import annotations

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from torchfl.planner.parallel import ParallelError, Split, candidates, plan_parallel
from torchfl.planner.parallel.experts import expert_bytes, expert_seconds
from torchfl.planner.whatif import chip_of

CHIP = "H100-SXM5-80GB"


def _cfg():
    return MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)


@pytest.fixture(scope="module")
def lm():
    from torchfl.kernels.grouped.torchop import register

    register()
    with torch.device("meta"):
        return MixtralForCausalLM(_cfg()).to(torch.bfloat16).eval()


def test_ep_candidates_for_a_moe_model_only_where_experts_and_batch_divide():
    cfg = _cfg()
    four = candidates(4, cfg, batch=4)
    assert Split(1, 1, 4) in four and Split(2, 1, 2) in four and Split(4, 1, 1) in four
    assert all(s.tp * s.pp * s.ep == 4 for s in four)
    assert all(s.ep == 1 for s in candidates(4, cfg, batch=1))      # batch 1 cannot be split over ep groups
    assert candidates(4, cfg, ep=2, batch=2) == [Split(2, 1, 2), Split(1, 2, 2)]
    assert candidates(4, cfg, tp=2, ep=2, batch=2) == [Split(2, 1, 2)]


def test_ep_refusals_are_one_line():
    cfg = _cfg()
    with pytest.raises(ParallelError, match="expert parallel 8 does not divide the 4 experts"):
        candidates(8, cfg, ep=8, batch=8)
    with pytest.raises(ParallelError, match="does not divide the batch of 1"):
        candidates(2, cfg, ep=2, batch=1)
    with pytest.raises(ParallelError, match="--tp 2 x --pp 1 x --ep 4 = 8 chips, but --chips gives 4"):
        candidates(4, cfg, tp=2, ep=4, batch=4)
    from transformers import LlamaConfig

    with pytest.raises(ParallelError, match="--ep 2: expert parallel .* this model has none"):
        candidates(2, LlamaConfig(), ep=2)


def test_a_fixed_ep_split_holds_its_experts_and_prices_the_all_to_alls(lm):
    h100 = chip_of(CHIP)
    ic = h100.hcd.interconnect
    r = plan_parallel(lm, h100, 2, batch=2, context=64, precision=None, ep=2)
    assert r["ok"] and r["chosen_by"] == "user" and r["split"] == {"tp": 1, "pp": 1, "ep": 2}
    best = r["rows"][0]
    assert best["fallbacks"] == 0
    a2a = best["collectives"]["all_to_all"]
    assert set(best["collectives"]) == {"all_to_all"}          # no tp, no pp: only the all-to-alls
    assert a2a["calls"] == 2 * 2 and a2a["seconds"] == pytest.approx(expert_seconds(lm.config, 2, 2, 1, 2, ic))
    assert a2a["bytes_per_token"] == expert_bytes(lm.config, 2, 2, 1, 2)["link_bytes"]["all_to_all"] / 2
    assert best["decode_s"] == pytest.approx(best["compute_s"] + best["collective_s"])
    assert best["collective_s"] == pytest.approx(a2a["seconds"])
    assert best["tokens_per_s"] == pytest.approx(2 / best["decode_s"])
    # memory per chip: half the experts, one sequence's KV cache
    one = plan_parallel(lm, h100, 1, batch=2, context=64, precision=None)["rows"][0]
    experts = sum(p.numel() * p.element_size() for n, p in lm.named_parameters() if ".experts." in n)
    assert best["kv_cache_bytes"] == one["kv_cache_bytes"] // 2
    assert one["peak_bytes"] - best["peak_bytes"] >= experts // 2
    assert best["peak_bytes"] > one["peak_bytes"] - experts         # the rest of the model stays whole


def test_cli_memory_with_ep_on_mixtral(tmp_path):
    """``plan memory mixtral-8x7b --layers 1 --chips 8x... --ep 8``: one expert of each layer per chip."""
    import json

    from click.testing import CliRunner

    from torchfl.cli.main import cli

    url = f"sqlite:///{tmp_path / 'r.sqlite3'}"
    assert CliRunner().invoke(cli, ["registry", "init", "--registry", url]).exit_code == 0
    args = ["plan", "memory", "mixtral-8x7b", "--layers", "1", "--chips", f"8x{CHIP}", "--ep", "8", "--batch", "8",
            "--context", "256", "--registry", url]
    res = CliRunner().invoke(cli, args + ["--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["split"] == {"tp": 1, "pp": 1, "ep": 8} and data["chosen_by"] == "user"
    row = data["rows"][0]
    assert row["fallbacks"] == 0 and row["collectives"]["all_to_all"]["calls"] == 2
    assert "expert parallel: 2 all-to-alls per MoE layer" in data["assumes"]
    bad = CliRunner().invoke(cli, args[:6] + [f"6x{CHIP}", "--ep", "3", "--batch", "6", "--registry", url])
    assert bad.exit_code != 0 and "expert parallel 3 does not divide the 8 experts" in bad.output
    assert "Traceback" not in bad.output


def test_the_estimate_of_a_moe_split_equals_its_full_plan():
    """A tp-split MoE shard: the full plan is captured as the estimates are, so the split chosen by the
    estimates is priced by the same graph (symbolic capture gave 347 steps against 338: 4% apart)."""
    from torchfl.planner.parallel.split import _decode_split, _estimate_split
    from torchfl.planner.whatif.serving import Engine

    cfg = _cfg()
    cfg.num_hidden_layers = 4
    with torch.device("meta"):
        lm4 = MixtralForCausalLM(cfg).to(torch.bfloat16).eval()
    h100 = chip_of(CHIP)
    for split in (Split(2, 1, 1), Split(1, 1, 2)):
        est = _estimate_split(lm4, h100, split, 2, 64, None, Engine())
        full = _decode_split(lm4, h100, split, 2, 64, None, Engine())
        assert est["decode_s"] == pytest.approx(full["decode_s"], rel=1e-9)
