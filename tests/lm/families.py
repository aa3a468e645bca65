"""Tiny configurations of the zoo's decoder families (Hugging Face transformers, built offline
from their configs with random weights): the models generate() is tested on."""
from __future__ import annotations

FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "phi", "gemma", "opt", "gpt_neox")

_COMMON = dict(vocab_size=128, max_position_embeddings=512)


def config(family: str):
    """A 2-layer configuration of ``family`` (hidden 64, 4 heads, 2 key/value heads where the
    family has grouped-query attention)."""
    import transformers as tf

    if family == "gpt2":
        return tf.GPT2Config(vocab_size=128, n_positions=512, n_embd=64, n_layer=2, n_head=4)
    if family == "opt":
        return tf.OPTConfig(vocab_size=128, max_position_embeddings=512, hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=4, ffn_dim=128, word_embed_proj_dim=64)
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                **_COMMON)
    if family == "phi":
        return tf.PhiConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                            **_COMMON)
    cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config,
           "gemma": tf.GemmaConfig}[family]
    extra = {"head_dim": 16} if family == "gemma" else {}
    return cls(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, **extra, **_COMMON)


def model(family: str, dtype=None, seed: int = 0):
    """(causal LM in eval mode, its config), random weights from ``seed``."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = config(family)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    if dtype is not None:
        m = m.to(dtype)
    return m, cfg
