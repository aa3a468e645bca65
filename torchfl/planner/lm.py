"""Causal language models as the what-if commands plan them: the decode step at a context,
with its KV cache as graph inputs and outputs, and the prefill of a prompt.

A Hugging Face causal LM with its default config (``use_cache=True``) keeps its past keys and
values in a ``DynamicCache`` object, which torch.export refuses as an input or output. Here the
cache is plain tensors at the graph's edges:

* :class:`DecodeStep` ``(input_ids[B, 1], k_0, v_0, k_1, v_1, ...)`` with each past tensor
  ``[B, kv_heads, context - 1, head_dim]``, returns ``(logits, k_0', v_0', ...)`` with the new
  token's keys and values appended (``context`` positions): the step a server runs per token;
* :class:`Prefill` ``(input_ids[B, P])`` returns ``(logits, k_0, v_0, ...)``: the prompt's pass.

The cache's tensors are named ``past_key_values_<layer>_<key|value>`` in the graph, which is
how the memory plan counts them per layer (``planner.memory.kv_cache_values``). The shapes come
from running the model once on one token (on the meta device for a model built there: no
weights needed), so every family's own cache layout (heads, head size, dtype) is used as is.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchfl.planner.errors import PlanError

__all__ = ["is_causal_lm", "experts_of", "CacheSpec", "cache_spec", "DecodeStep", "Prefill", "decode_inputs", "prefill_inputs",
           "KV_NAME", "ShapeTooLarge", "shapes_only"]

KV_NAME = "past_key_values_{layer}_{kind}"


def is_causal_lm(module) -> bool:
    """A Hugging Face model that generates (a ``*ForCausalLM`` with a cache-aware forward)."""
    try:
        from transformers import GenerationMixin, PreTrainedModel
    except ImportError:    # transformers is optional for torchfl itself
        return False
    return isinstance(module, PreTrainedModel) and isinstance(module, GenerationMixin) and \
        getattr(module.config, "is_encoder_decoder", False) is False


@dataclass(frozen=True)
class CacheSpec:
    """One layer's cached keys (values alike) per position: ``[batch, heads, *, head_dim]``."""

    layers: int
    heads: int
    head_dim: int
    dtype: object          # torch.dtype
    device: object         # torch.device of the model (meta for a model built there)

    def shape(self, batch: int, positions: int) -> tuple:
        return (int(batch), self.heads, int(positions), self.head_dim)

    def nbytes(self, batch: int, positions: int) -> int:
        """Bytes of the whole cache (keys and values of every layer)."""
        import torch

        item = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.layers * batch * self.heads * positions * self.head_dim * item


def experts_of(lm) -> dict | None:
    """A mixture-of-experts LM's experts, for the what-if answers that must say both what memory
    holds (every expert) and what a token reads (its top-k per layer): ``{"per_layer": E,
    "active_per_token": k, "expert_bytes": B}`` (B: the bytes of every parameter under an
    ``experts`` module, as stored), or None for a dense model. Read from the Hugging Face config
    (``num_local_experts`` for Mixtral, ``num_experts`` for Qwen2-MoE and OLMoE)."""
    config = getattr(lm, "config", None)
    per_layer = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    active = getattr(config, "num_experts_per_tok", None)
    if not per_layer or not active:
        return None
    held = sum(p.numel() * p.element_size() for name, p in lm.named_parameters() if ".experts." in f".{name}.")
    return {"per_layer": int(per_layer), "active_per_token": int(active), "expert_bytes": int(held)}


def _device(module):
    import torch

    p = next(iter(module.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def cache_spec(lm) -> CacheSpec:
    """The cache layout of ``lm``, read from one forward pass on a one-token prompt."""
    import torch

    device = _device(lm)
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    with torch.no_grad():
        out = lm(input_ids=ids, use_cache=True)
    layers = _layers(_returned_cache(out))
    if not layers:
        raise ValueError(f"{type(lm).__name__} returned no key/value cache: it cannot be planned as a decoder")
    k = layers[0][0]
    return CacheSpec(len(layers), int(k.shape[1]), int(k.shape[3]), k.dtype, device)


def _returned_cache(out):
    """The cache a forward returned (``cache`` in transformers >= 5.24, else ``past_key_values``)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _layers(cache) -> list:
    """[(keys, values)] per layer of a transformers cache (DynamicCache in transformers 5)."""
    if cache is None:
        return []
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache]     # legacy tuple of tuples


def _new_cache(lm, past):
    """A DynamicCache holding ``past`` (keys, values per layer) as they are: filled in place of
    ``update``, which would concatenate them to an empty rank-1 tensor first."""
    from transformers import DynamicCache

    cache = DynamicCache(config=lm.config)
    for i in range(0, len(past), 2):
        layer = cache.layers[i // 2]
        layer.lazy_initialization(past[i], past[i + 1])
        layer.keys, layer.values = past[i], past[i + 1]
    return cache


def _empty_cache(lm):
    """A DynamicCache whose layers take the prompt's keys and values as they are: a fresh
    layer concatenates them to ``torch.tensor([])``, a constant torch.export cannot lift."""
    import types

    from transformers import DynamicCache

    cache = DynamicCache(config=lm.config)
    for layer in cache.layers:
        layer.update = types.MethodType(_first_update, layer)
    return cache


def _first_update(self, key_states, value_states, *args, **kwargs):
    """A cache layer's ``update`` for the prompt: it holds the prompt's keys and values."""
    if self.is_initialized:
        return type(self).update(self, key_states, value_states, *args, **kwargs)
    self.lazy_initialization(key_states, value_states)
    self.keys, self.values = key_states, value_states
    return self.keys, self.values


def _cache_kwarg(lm) -> str:
    """The forward's name for the cache: ``cache`` (transformers >= 5.24), else ``past_key_values``."""
    import inspect

    params = inspect.signature(lm.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _flat(logits, cache) -> tuple:
    out = [logits]
    for k, v in _layers(cache):
        out += [k, v]
    return tuple(out)


def _torch_module():
    import torch

    return torch.nn.Module


def _make_classes():
    Module = _torch_module()

    class DecodeStep(Module):
        """One decode step of a causal LM with its cache as tensors (module docstring)."""

        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, *past):
            kw = {_cache_kwarg(self.lm): _new_cache(self.lm, past)}
            out = self.lm(input_ids=input_ids, use_cache=True, **kw)
            return _flat(out.logits, _returned_cache(out))

    class Prefill(Module):
        """The prompt's forward pass of a causal LM, its new cache as tensors."""

        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids):
            kw = {_cache_kwarg(self.lm): _empty_cache(self.lm)}
            out = self.lm(input_ids=input_ids, use_cache=True, **kw)
            return _flat(out.logits, _returned_cache(out))

    return DecodeStep, Prefill


_CLASSES = None


def _classes():
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _make_classes()
    return _CLASSES


def DecodeStep(lm):  # noqa: N802 - a class, built on first use
    return _classes()[0](lm)


def Prefill(lm):  # noqa: N802
    return _classes()[1](lm)


class ShapeTooLarge(PlanError, ValueError):
    """A what-if size (context, batch, prompt) whose tensors no tensor could hold: refused
    before any shape is built (the CLI prints it as one line)."""

    kind = "Error"


# the largest tensor torch can describe: its byte size must fit a signed 64-bit integer
MAX_TENSOR_BYTES = 2 ** 63 - 1


def _check_sizes(what: str, **sizes) -> None:
    for name, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ShapeTooLarge(f"{what}: {name} must be a positive integer, got {v!r}")


def _check_bytes(what: str, nbytes: int, fix: str) -> None:
    if nbytes > MAX_TENSOR_BYTES:
        raise ShapeTooLarge(f"{what} would be {nbytes:.3e} bytes, more than any tensor can describe "
                            f"(2**63 bytes); {fix}")


def shapes_only(shapes_dtypes, device) -> tuple:
    """Tensors with these (shape, dtype)s and no storage: meta tensors for a model on the meta
    device, else fake tensors on ``device`` (torch.export traces them with the model's real
    weights). Why: a what-if answer describes a KV cache of gigabytes or terabytes; it must
    never allocate one (issue 52: ``--context 10**12`` asked the allocator for 128 TB)."""
    import torch

    if torch.device(device).type == "meta":
        return tuple(torch.empty(s, dtype=d, device="meta") for s, d in shapes_dtypes)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        return tuple(torch.empty(s, dtype=d, device=device) for s, d in shapes_dtypes)


def decode_inputs(lm, batch: int, context: int, spec: CacheSpec | None = None):
    """(DecodeStep(lm), its inputs) for the step that brings the cache to ``context`` positions.
    The inputs are shapes without storage (:func:`shapes_only`): callers that run the step
    make their own tensors of these shapes. Sizes are checked before anything is built."""
    import torch

    _check_sizes("decode step", batch=batch, context=context)
    if context < 2:
        raise ShapeTooLarge(f"context must be at least 2 (one cached position and the new token), got {context}")
    spec = spec or cache_spec(lm)
    item = torch.empty((), dtype=spec.dtype).element_size()
    _check_bytes(f"one layer's cached keys at batch {batch}, context {context}",
                 batch * spec.heads * (context - 1) * spec.head_dim * item, "give a smaller --context or --batch")
    layout = [((batch, 1), torch.long)] + [(spec.shape(batch, context - 1), spec.dtype)] * (2 * spec.layers)
    return DecodeStep(lm), shapes_only(layout, spec.device)


def prefill_inputs(lm, batch: int, prompt: int, spec: CacheSpec | None = None):
    """(Prefill(lm), its inputs): the forward pass over a ``prompt``-token prompt (shapes
    without storage, as :func:`decode_inputs`)."""
    import torch

    _check_sizes("prefill", batch=batch, prompt=prompt)
    spec = spec or cache_spec(lm)
    heads = getattr(getattr(lm, "config", None), "num_attention_heads", None) or spec.heads
    item = torch.empty((), dtype=spec.dtype).element_size()
    # the largest tensor of a prefill: one layer's attention scores, [batch, heads, prompt, prompt]
    _check_bytes(f"the prompt's attention scores at batch {batch}, prompt {prompt}",
                 batch * int(heads) * prompt * prompt * item, "give a smaller --prompt or --batch")
    return Prefill(lm), shapes_only([((batch, prompt), torch.long)], spec.device)


def kv_input_names(n_layers: int) -> list[str]:
    """Placeholder names the decode step's cache inputs get (graph order)."""
    return [KV_NAME.format(layer=i, kind=k) for i in range(n_layers) for k in ("key", "value")]


def rename_cache_inputs(captured, n_layers: int):
    """The decode step's captured graph with its cache placeholders named :data:`KV_NAME`."""
    names = kv_input_names(n_layers)
    inputs = [n for n in captured.graph_module.graph.nodes if n.op == "placeholder"
              and any(name == n.name and kind == "input" for name, kind, _t in captured.placeholders)]
    cache_nodes = inputs[1:1 + len(names)]
    renamed = {}
    for node, name in zip(cache_nodes, names):
        renamed[node.name] = name
        node.name = name
        node.target = name
    captured.graph_module.recompile()
    captured.placeholders = [(renamed.get(n, n), kind, t) for n, kind, t in captured.placeholders]
    captured.tensors = {renamed.get(k, k): v for k, v in captured.tensors.items()}
    captured.outputs = [renamed.get(o, o) if o else o for o in captured.outputs]
    return captured


# ---------------------------------------------------------------- models for the CLI (zoo names)

# LLaMA-2 7B and 70B as their published configs give them (meta-llama/Llama-2-{7b,70b}-hf
# config.json: hidden, layers, heads, key/value heads, MLP width, 4096 positions, RMS eps 1e-5,
# float16 weights). transformers' LlamaConfig() defaults are LLaMA-1's (2048 positions, eps 1e-6):
# a named model is the published one, so every field that differs is stated here.
_LLAMA2 = dict(vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5)
_LLAMA = {
    "7b": dict(_LLAMA2, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32),
    "70b": dict(_LLAMA2, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8),
    # four small layers (the twin of planner.repeat applies): fidelity's end-to-end test
    "tiny": dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=4096),
}


def llama(size: str = "7b", batch: int = 1, seq_len: int = 8, layers: int | None = None, dtype=None):
    """LLaMA-2 ``size`` with its published config (4096 positions, ``use_cache=True``) built on the
    meta device in ``dtype`` (float16 by default, the published weights' dtype): no weights in RAM,
    so a 70B model plans on a laptop.
    (module, (input_ids,))."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(_LLAMA[size])
    if layers:
        kw["num_hidden_layers"] = layers
    config = LlamaConfig(**kw)
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(dtype or torch.float16).eval()
    return model, (torch.zeros((batch, seq_len), dtype=torch.long, device="meta"),)


def tiny_llama(batch: int = 1, seq_len: int = 8, layers: int | None = None):
    """A 2-layer LLaMA (hidden 64, 4 heads, 2 key/value heads, 128-token vocabulary), random
    weights (seed 0), float32, default config otherwise: small enough to run on the emulator."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers or 2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    return model, (torch.randint(0, 128, (batch, seq_len)),)
