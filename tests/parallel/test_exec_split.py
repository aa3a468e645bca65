"""A tiny LLaMA run split over emulated chips: the unsplit model's logits, the plan's link bytes.

Tolerance: float32, |diff| <= 1e-5 on logits of magnitude ~1. A split changes only the order of
the sums (a row-parallel linear's partial products are added by the ring, not inside one dot
product; the vocabulary-parallel embedding adds zeros), so the difference is float32 rounding
(measured <= 1.7e-7). float16 (the chip computes in float16 against a float16 host reference):
|diff| <= 4e-3, eight float16 ulps at logits ~0.5 (measured 4.9e-4, one ulp; the float16 host model is
itself 2.9e-4 from the float32 one: the chip's and the host's accumulation orders differ).
"""

from __future__ import annotations

import pytest
import torch

from torchfl.planner.lm import tiny_llama
from torchfl.planner.parallel import ParallelError, ShardError, Split, collective_seconds
from torchfl.planner.whatif import chip_of
from torchfl.runtime.parallel import run_split

CHIP = "H100-SXM5-80GB"


@pytest.fixture(scope="module")
def model():
    lm, (ids,) = tiny_llama(batch=2, seq_len=8)      # 2 layers, hidden 64, 4 heads, 2 kv heads, vocab 128
    with torch.no_grad():
        ref = lm(ids).logits[:, -1]
    return lm, ids, ref


@pytest.mark.parametrize("tp,pp", [(2, 1), (4, 1), (1, 2), (2, 2)])
def test_a_split_run_equals_the_unsplit_model_and_moves_the_planned_bytes(model, tp, pp):
    lm, ids, ref = model
    run = run_split(lm, ids, chips=f"{tp * pp}x{CHIP}", tp=tp, pp=pp)
    assert (run.logits - ref).abs().max().item() <= 1e-5
    assert run.copies_equal and run.fallbacks == 0
    assert run.programs_run == tp * (2 * 2 + 1 + (pp - 1) + 1)        # 2 a layer; embed, finish, head
    assert run.counted == run.planned and run.matches_plan()
    act = 2 * 8 * 64 * 4                                               # batch x tokens x hidden x float32
    if tp > 1:                                                         # 2 a layer + the embedding's, ring
        assert run.counted["all_reduce"] == (2 * 2 + 1) * 2 * (tp - 1) * act
        assert run.counted["all_gather"] == (tp - 1) * 2 * 128 * 4
    assert run.counted["p2p"] == (pp - 1) * tp * act
    ring = {(s * tp + r, s * tp + (r + 1) % tp) for s in range(pp) for r in range(tp)} if tp > 1 else set()
    hand = {((s - 1) * tp + r, s * tp + r) for s in range(1, pp) for r in range(tp)}
    assert set(tuple(map(int, k.split("->"))) for k in run.links["links"]) == ring | hand
    # the collectives that ran, priced one by one, are the plan's collective time: same calls, same sizes
    ic = chip_of(CHIP).hcd.interconnect
    planned_s = collective_seconds(lm.config, Split(tp, pp), 2, 8, 4, ic)["collective_s"]
    assert run.link_seconds(ic) == pytest.approx(planned_s, rel=1e-12)


def test_float16_split_on_the_chip(model):
    lm, ids, _ = model
    half = tiny_llama(batch=2, seq_len=8)[0].half()
    with torch.no_grad():
        ref = half(ids).logits[:, -1].float()
    run = run_split(half, ids, chips=f"2x{CHIP}", tp=2, precision="float16")
    assert run.logits.dtype == torch.float16 and run.matches_plan()
    assert (run.logits.float() - ref).abs().max().item() <= 4e-3


def test_splits_the_model_does_not_admit_are_refused_in_one_line(model):
    lm, ids, _ = model
    with pytest.raises(ShardError, match="tensor parallel 3 does not divide the attention heads"):
        run_split(lm, ids, chips=f"3x{CHIP}", tp=3)
    with pytest.raises(ParallelError, match="tp 2 x pp 1 = 2 chips, but chips='4x"):
        run_split(lm, ids, chips=f"4x{CHIP}", tp=2, pp=1)
    with pytest.raises(ParallelError, match="pp 4 does not divide the model's 2 layers"):
        run_split(lm, ids, chips=f"4x{CHIP}", tp=1, pp=4)


def test_biases_of_row_parallel_linears_are_added_once():
    """o_proj and down_proj biases live on rank 0 only (the all-reduce would add tp copies); q/k/v and
    gate/up biases are sliced with their rows. A LLaMA with every bias on, tied embeddings, tp 2."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, attention_bias=True, mlp_bias=True,
                      tie_word_embeddings=True)
    torch.manual_seed(1)
    lm = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5)
    ids = torch.randint(0, 128, (2, 8))
    with torch.no_grad():
        ref = lm(ids).logits[:, -1]
    run = run_split(lm, ids, chips=f"2x{CHIP}", tp=2)
    assert (run.logits - ref).abs().max().item() <= 1e-5 and run.matches_plan()


def test_a_program_meeting_more_shapes_than_dynamos_limit_still_runs_on_the_chip(model):
    """Dynamo keeps 8 graphs per code object and past that runs the function eagerly on the host,
    silently; with the limit at 1, a new shape (batch 3) must still be planned and run on the chip."""
    import torch._dynamo

    lm = model[0]
    ids = torch.randint(0, 128, (3, 5))
    with torch.no_grad():
        ref = lm(ids).logits[:, -1]
    with torch._dynamo.config.patch(recompile_limit=1):
        run = run_split(lm, ids, chips=f"2x{CHIP}", tp=2)
    assert run.programs_run == 2 * (2 * 2 + 1 + 1) and (run.logits - ref).abs().max().item() <= 1e-5
