"""Issue 53 point 2: ``llama-7b`` / ``llama-70b`` are the published LLaMA-2 configs (4096
positions, RMS eps 1e-5, float16 weights), not transformers' LlamaConfig() defaults (LLaMA-1's
2048 positions), so ``plan max-context llama-7b`` is not "2048 tokens, limited by model positions"."""
import pytest

pytest.importorskip("transformers")

# meta-llama/Llama-2-{7b,70b}-hf config.json
PUBLISHED = {
    "llama-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=32),
    "llama-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                      num_key_value_heads=8),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_named_llama_is_the_published_config(name):
    import torch

    from torchfl.planner.zoo import load_model

    model, (ids,) = load_model(name, layers=1)      # one layer: the config is what is checked
    c = model.config
    assert c.max_position_embeddings == 4096 and c.rms_norm_eps == 1e-5 and c.vocab_size == 32000
    for key, value in PUBLISHED[name].items():
        if key != "num_hidden_layers":
            assert getattr(c, key) == value, (name, key)
    assert {p.dtype for p in model.parameters()} == {torch.float16}     # the published weights' dtype
    assert ids.device.type == "meta"


def test_llama_7b_layers_default_to_the_published_32():
    from torchfl.planner.lm import _LLAMA

    assert _LLAMA["7b"]["num_hidden_layers"] == 32 and _LLAMA["70b"]["num_hidden_layers"] == 80
