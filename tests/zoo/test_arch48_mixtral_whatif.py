"""Issue 48 item 5: Mixtral 8x7B at its published size (transformers' default MixtralConfig,
bfloat16 weights, the meta device: the zoo name ``mixtral-8x7b``) answers the what-if commands
with 0 fallbacks: memory holds every expert (8 per layer, ~87 GiB of parameters), a decode step
plans its experts as grouped_mm kernels whose reads are priced over the routings (plan explain
gives the range: 1..2 experts' weights for one token's top-2).

Before core 1.21.0: 96 ops per decode step fell back to the CPU (torch._grouped_mm twice and the
inverse permutation once per layer); with float16 weights the capture itself failed
(torch's meta kernel of _grouped_mm takes bfloat16 only)."""
import json

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")

from torchfl.cli.main import cli  # noqa: E402

EXPERT_BYTES = 8 * 3 * 4096 * 14336 * 2          # one layer's experts: gate, up, down, bfloat16


def plan(*args):
    return CliRunner().invoke(cli, ["plan", *args])


def test_the_published_config_on_the_meta_device():
    import torch

    from torchfl.planner.zoo import load_model

    model, (ids,) = load_model("mixtral-8x7b", layers=1)
    c = model.config
    assert (c.hidden_size, c.intermediate_size, c.num_local_experts, c.num_experts_per_tok) == (4096, 14336, 8, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (32, 8, 32000)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and ids.device.type == "meta"


def test_one_layer_explained_whole_with_the_routing_range():
    out = plan("explain", "mixtral-8x7b", "--layers", "1", "--chip", "MI300X")
    assert out.exit_code == 0, out.output
    assert " 0 fallbacks to CPU" in out.output
    text = " ".join(out.output.split())
    assert text.count("tokens per expert from the routing at run time") == 2     # gate_up and down
    assert "weight passes 1..8 over the routings" in text                        # 8 tokens x top-2: 16 rows


@pytest.mark.slow
def test_decode_step_planned_whole_holding_every_expert():
    out = plan("decode", "mixtral-8x7b", "--chip", "MI300X", "--context", "1024", "--json")
    assert out.exit_code == 0, out.output
    res = json.loads(out.output)
    row = res["rows"][0] if "rows" in res else res
    assert row.get("decode_fallbacks", 0) == 0 and row.get("fallbacks", 0) == 0, row
    assert row["peak_bytes"] >= 32 * EXPERT_BYTES          # every expert of every layer is resident


def test_decode_says_every_expert_is_held_and_how_many_a_step_reads(tmp_path):
    """`plan decode` of an MoE model says both halves (issue 48 item 1: "memory holds every
    expert; decode reads the active ones: say both"): all 8 experts of each layer held, a one-token
    step reads at most its top-2 per layer, a batch of 8 tokens at most all 8. Before, the text
    said neither; a dense model gets no such line."""
    from torchfl.planner.lm import experts_of
    from torchfl.planner.whatif.serving import experts_read
    from torchfl.planner.zoo import load_model

    model, _ids = load_model("mixtral-8x7b", layers=1)
    ex = experts_of(model)
    assert ex == {"per_layer": 8, "active_per_token": 2, "expert_bytes": EXPERT_BYTES}
    one, eight = experts_read(model, 1), experts_read(model, 8)
    assert (one["read_per_layer"], one["read_bytes"]) == (2, EXPERT_BYTES // 4)
    assert (eight["read_per_layer"], eight["read_bytes"]) == (8, EXPERT_BYTES)
    dense, _ = load_model("tiny-llama")
    assert experts_of(dense) is None
    factory = tmp_path / "one_layer.py"          # the published config, one layer (a model file: seconds)
    factory.write_text("from torchfl.planner.zoo import load_model\n\n\ndef make():\n"
                       "    return load_model('mixtral-8x7b', layers=1)\n")
    out = plan("decode", f"{factory}:make", "--chip", "MI300X", "--context", "64", "--prompt", "8")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "experts: all 8 of each layer held in memory (2.62 GiB); a step of 1 token reads at most 2 of them " \
           "per layer (672.00 MiB, top-2 routing)" in text
