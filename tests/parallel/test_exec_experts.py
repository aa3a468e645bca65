"""A tiny Mixtral run expert-parallel on emulated chips: the unsplit logits, the plan's all-to-all bytes.

Tolerance: float32, |diff| <= 1e-5 (measured 1.5e-7): the split changes only the order in which a
token's top-k expert outputs are summed (and the chip's kernels against the host's).
"""

from __future__ import annotations

import pytest
import torch
from transformers import MixtralConfig, MixtralForCausalLM

from torchfl.planner.parallel import ParallelError
from torchfl.planner.parallel.collectives import all_to_all_s
from torchfl.planner.parallel.experts import expert_bytes, expert_seconds
from torchfl.planner.whatif import chip_of
from torchfl.runtime.parallel import run_expert_parallel

CHIP = "H100-SXM5-80GB"


@pytest.fixture(scope="module")
def model():
    cfg = MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    lm = MixtralForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (4, 8))
    with torch.no_grad():
        ref = lm(ids).logits[:, -1]
    return lm, ids, ref


@pytest.mark.parametrize("ep", [2, 4])
def test_expert_parallel_equals_the_unsplit_model_and_moves_the_planned_bytes(model, ep):
    lm, ids, ref = model
    run = run_expert_parallel(lm, ids, chips=f"{ep}x{CHIP}")
    assert (run.logits - ref).abs().max().item() <= 1e-5
    assert run.fallbacks == 0 and run.programs_run == ep * (1 + 2 * 3 + 1)   # embed, 2 x (attention, route, experts), head
    block = 4 // ep * (4 // ep * 8) * 64 * 4                  # experts a chip x its tokens x hidden x float32
    assert run.counted == run.planned == {"all_to_all": 2 * 2 * ep * (ep - 1) * block}
    assert run.links["links"] == {f"{i}->{j}": 2 * 2 * block for i in range(ep) for j in range(ep) if i != j}
    ic = chip_of(CHIP).hcd.interconnect
    assert run.link_seconds(ic) == pytest.approx(expert_seconds(lm.config, ep, 4, 8, 4, ic), rel=1e-12)


def test_the_all_to_alls_are_priced_from_the_same_bytes(model):
    cfg = model[0].config
    ic = chip_of(CHIP).hcd.interconnect
    b = expert_bytes(cfg, 4, 4, 8, 2)
    assert b["all_to_alls"] == 4 and b["block_bytes"] == 1 * 8 * 64 * 2
    assert expert_seconds(cfg, 4, 4, 8, 2, ic) == pytest.approx(4 * all_to_all_s(b["block_bytes"], 4, ic))
    assert expert_seconds(cfg, 1, 4, 8, 2, ic) == 0.0


def test_expert_splits_the_model_does_not_admit_are_refused(model):
    lm, ids, _ = model
    with pytest.raises(ParallelError, match="expert parallel 3 does not divide the 4 experts"):
        run_expert_parallel(lm, ids, chips=f"3x{CHIP}")
    with pytest.raises(ParallelError, match="only mixture-of-experts decoders"):
        expert_bytes(type("Cfg", (), {"num_hidden_layers": 2})(), 2, 4, 8, 2)
