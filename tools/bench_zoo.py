"""Model zoo breadth benchmark: Hugging Face ``transformers`` families (``--models hf``: the
24 of them) and the project's ResNets compiled with ``backend="torchfl"`` or run on the eager
``npu`` device, per chip:
fallback nodes, error vs eager, compile and run time.

    python tools/bench_zoo.py [--json] [--models bert,llama,...] [--chips NPU-V3,...]
                              [--list] [--strict] [--mode compile|eager] [--train]
                              [--cluster ADDRESS [--registry URL]] [--resume RUN]

``--mode eager`` runs the same models on the npu device instead (``TORCHFL_DEVICES`` set to
the chips, in ``--chips`` order): weights and inputs moved with ``.to("npu:i")``, floating
weights and inputs in the chip's dtype (``model.half()`` for float16), standard calls
under ``torch.no_grad()``, and ``TORCHFL_PRECISION`` set to that dtype, the eager form of
compile mode's ``precision`` option (rotary embeddings compute in float32 on purpose, which
a float16-only chip computes in float16). ``fallbacks`` are then host-fallback op calls of the run
(``ops.ROUTES``), ``compile_s`` the first call (one-op plans and kernel loads). ``--train``
adds, in compile mode, one compiled forward and backward whose gradients are compared with eager
torch's (:func:`train_compiled`; ``train_grad_error``), and in eager mode a forward, backward and
SGD step of each model as the article trains:
float32 weights on ``--train-chip`` (TFL-X1, which has float32 and float16 units; the
last npu index), ``torch.autocast("npu", dtype=torch.float16)``, no precision policy
(``train_ok``: it ran, every gradient finite, every parameter finite after the step;
``train_params_moved``: how many changed; ``train_fallbacks``: host-fallback calls in it).
A float16-only chip cannot hold float32 master weights: under the precision policy its
float32 ops compute in float16, and an RMS norm's backward (``rsqrt`` cubed) overflows.

Every model is built offline from a small config (random weights, nothing downloaded,
``torch.manual_seed(0)``), in eval mode, and run on the same inputs by eager torch
(float32) and by the compiled model. Per (model, chip):

- ``fallbacks``: FX nodes run on the CPU at every call (``plan.fallbacks``, all graphs of
  the model), and ``fallback_ops`` (op -> count); ``folded`` nodes (input-independent,
  computed once) are counted apart: they are not fallbacks;
- ``error``: max |ours - eager| / max(1, max |eager|) per floating output tensor (each
  layer's hidden state: ``output_hidden_states=True``), the worst one (within ``tolerance``
  for the precision: float16 2e-2, bfloat16 8e-2 -- a few ulps of the storage dtype
  accumulated over a couple of layers, fp32 accumulation);
- ``compile_s``: the first call (capture, plan, Numba kernel compile or cache load, run);
  ``run_s``: median of ``--runs`` further calls; ``eager_s``: the same for eager fp32;
- ``error_message``: what the compile or the run raised, if anything (then no figures).

Chips: NPU-V3 with float16 (the article's chip), TFL-X1 with bfloat16 (a native bf16
unit), DSP-M4 with float16 (no attention unit: attention must be decomposed on chip).
The machine is shared: compare only figures from one run.

``--cluster ADDRESS`` runs each (model, chip) as a Ray task (``pip install 'torchfl[cluster]'``;
``--mode compile`` only), one thread per unit, each result written once to the registry
(``--registry``, else the default) as a sweep that ``--resume RUN`` finishes if this driver
stops: times are then each node's, one thread each, not comparable with a local run's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".cache", "numba"))

CHIPS = {"NPU-V3": "float16", "TFL-X1": "bfloat16", "DSP-M4": "float16"}
TOLERANCE = {"float16": 2e-2, "bfloat16": 8e-2, None: 1e-4}

SEQ = 16
BATCH = 2
# small sizes: 64 hidden, 4 query heads (every bundled attention unit runs 4), 2 layers
TXT = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
           max_position_embeddings=128)
# decoders as a user builds them: the default use_cache=True (a DynamicCache that starts from empty
# 1-D tensors and is concatenated with each layer's keys), grouped-query: 4 query heads, 2 KV heads
DEC = dict(TXT, num_key_value_heads=2)


# every layer's hidden state is compared, not only the last: a tiny random conv net's top can be
# all zeros (EfficientNet's is, MobileNetV2's ~1e-25), which would compare nothing
HIDDEN = {"output_hidden_states": True}


def _tokens(vocab=512, batch=BATCH, seq=SEQ):
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randint(3, vocab, (batch, seq), generator=g)


def _config(tr, cfg_name, model_name, kw):
    """The model on PyTorch's sdpa where transformers implements it for the family, else
    its eager attention (matmul, softmax, matmul)."""
    cls = getattr(tr, model_name)
    try:
        return cls(getattr(tr, cfg_name)(**kw, attn_implementation="sdpa"))
    except (ValueError, TypeError):
        return cls(getattr(tr, cfg_name)(**kw))


def _text(cfg_name, model_name, **kw):
    """Token ids and the attention mask a tokenizer returns for a padded batch (the second
    sequence's last quarter is padding): masks are then built from an input, per call."""
    def build():
        import torch
        import transformers as tr

        ids = _tokens(kw.get("vocab_size", 512))
        mask = torch.ones_like(ids)
        mask[1, -SEQ // 4:] = 0
        return _config(tr, cfg_name, model_name, kw), (ids,), {"attention_mask": mask, **HIDDEN}
    return build


def _seq2seq(cfg_name, model_name, **kw):
    """Encoder-decoder: token ids, the padded batch's attention mask, decoder ids (the shifted
    targets a training step or the first generate step gives)."""
    def build():
        import torch
        import transformers as tr

        ids = _tokens(kw.get("vocab_size", 512))
        mask = torch.ones_like(ids)
        mask[1, -SEQ // 4:] = 0
        dec = _tokens(kw.get("vocab_size", 512), seq=SEQ // 2)
        return _config(tr, cfg_name, model_name, kw), (ids,), {"attention_mask": mask, "decoder_input_ids": dec, **HIDDEN}
    return build


def _image(cfg_name, model_name, size=32, channels=3, **kw):
    def build():
        import torch
        import transformers as tr

        g = torch.Generator().manual_seed(1)
        return _config(tr, cfg_name, model_name, kw), (torch.randn(BATCH, channels, size, size, generator=g),), dict(HIDDEN)
    return build


def _audio(cfg_name, model_name, samples=1600, **kw):
    def build():
        import torch
        import transformers as tr

        g = torch.Generator().manual_seed(1)
        return _config(tr, cfg_name, model_name, kw), (torch.randn(BATCH, samples, generator=g),), dict(HIDDEN)
    return build


def _resnet(kind):
    def build():
        from torchfl.planner.zoo import load_model

        model, inputs = load_model(kind, batch=1, image=64)
        return model, inputs, {}
    return build


_V = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
          patch_size=8)
_W2V = dict(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=(32, 32, 32), conv_stride=(5, 4, 2), conv_kernel=(10, 4, 2), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4)

# name: (what it exercises, builder)
MODELS = {
    "bert": ("encoder, absolute positions", _text("BertConfig", "BertModel", **TXT)),
    "roberta": ("encoder, position ids from the input (ne/cumsum)", _text("RobertaConfig", "RobertaModel", **TXT)),
    "distilbert": ("encoder", _text("DistilBertConfig", "DistilBertModel", vocab_size=512, dim=64, n_layers=2,
                                    n_heads=4, hidden_dim=128, max_position_embeddings=128)),
    "albert": ("encoder, shared layers", _text("AlbertConfig", "AlbertModel", **TXT, embedding_size=32)),
    "electra": ("encoder", _text("ElectraConfig", "ElectraModel", **TXT, embedding_size=64)),
    "gpt2": ("decoder, causal mask", _text("GPT2Config", "GPT2Model", vocab_size=512, n_embd=64, n_layer=2,
                                           n_head=4, n_positions=128, bos_token_id=0,
                                           eos_token_id=0)),
    "opt": ("decoder", _text("OPTConfig", "OPTModel", vocab_size=512, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, ffn_dim=128, max_position_embeddings=128,
                             word_embed_proj_dim=64)),
    "gpt_neox": ("decoder, partial rotary", _text("GPTNeoXConfig", "GPTNeoXModel", **TXT)),
    "phi": ("decoder, partial rotary", _text("PhiConfig", "PhiModel", **DEC)),
    "llama": ("decoder, rotary, GQA, RMS norm", _text("LlamaConfig", "LlamaModel", **DEC)),
    "mistral": ("decoder, rotary, GQA", _text("MistralConfig", "MistralModel", **DEC)),
    "qwen2": ("decoder, rotary, GQA", _text("Qwen2Config", "Qwen2Model", **DEC)),
    "gemma": ("decoder, rotary, GQA", _text("GemmaConfig", "GemmaModel", **DEC, head_dim=16)),
    "bloom": ("decoder, ALiBi", _text("BloomConfig", "BloomModel", vocab_size=512, hidden_size=64, n_layer=2,
                                      n_head=4)),
    "t5": ("encoder-decoder, relative position buckets, RMS norm",
           _seq2seq("T5Config", "T5Model", vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)),
    "vit": ("vision encoder", _image("ViTConfig", "ViTModel", **_V)),
    "deit": ("vision encoder", _image("DeiTConfig", "DeiTModel", **_V)),
    "swin": ("vision, windows (pad, roll, as_strided)",
             _image("SwinConfig", "SwinModel", image_size=32, patch_size=4, embed_dim=32, depths=[2, 2],
                    num_heads=[2, 4], window_size=4)),
    "convnext": ("conv net, depthwise 7x7, layer norm",
                 _image("ConvNextConfig", "ConvNextModel", image_size=32, hidden_sizes=[16, 32], depths=[1, 1],
                        num_stages=2)),
    "mobilenet_v2": ("conv net, depthwise, relu6, padding",
                     _image("MobileNetV2Config", "MobileNetV2Model", image_size=32, depth_multiplier=0.35)),
    "resnet_hf": ("conv net", _image("ResNetConfig", "ResNetModel", hidden_sizes=[16, 32], depths=[1, 1],
                                     embedding_size=16)),
    "regnet": ("conv net, grouped convolutions, squeeze-excite",
               _image("RegNetConfig", "RegNetModel", hidden_sizes=[16, 32], depths=[1, 1], embedding_size=16,
                      groups_width=8)),
    "efficientnet": ("conv net, depthwise, swish, squeeze-excite, ceil-mode average pooler",
                     _image("EfficientNetConfig", "EfficientNetModel", image_size=32, hidden_dim=320,
                            width_coefficient=0.25, depth_coefficient=0.25)),
    "wav2vec2": ("audio, 1-D conv, group norm", _audio("Wav2Vec2Config", "Wav2Vec2Model", **_W2V)),
    "resnet18": ("the project's ResNet-18, 64x64", _resnet("resnet18")),
    "resnet50": ("the project's ResNet-50, 64x64", _resnet("resnet50")),
}
DEFAULT = [m for m in MODELS if m != "resnet50"]
HF = [m for m in MODELS if not m.startswith("resnet") or m == "resnet_hf"]   # the Hugging Face families


def _bfloat16(build):
    """The model with bfloat16 weights (Mixtral's and OLMoE's published dtype): transformers then
    runs its experts through torch._grouped_mm, compiled or not."""
    def built():
        import torch

        model, args, kwargs = build()
        return model.to(torch.bfloat16), args, kwargs
    return built


# mixture of experts (issue 48): 4 experts, 2 per token, the decoders' sizes; ``*_bf16``: the
# same in bfloat16 (run them with --chips TFL-X1). Named with --models moe, not in the default sweep.
_MOE = dict(DEC, num_experts_per_tok=2)
MOE = {
    "mixtral": ("MoE decoder", _text("MixtralConfig", "MixtralModel", **_MOE, num_local_experts=4)),
    "qwen2_moe": ("MoE decoder, shared expert",
                  _text("Qwen2MoeConfig", "Qwen2MoeModel", **_MOE, num_experts=4, moe_intermediate_size=64,
                        shared_expert_intermediate_size=64)),
    "olmoe": ("MoE decoder", _text("OlmoeConfig", "OlmoeModel", **_MOE, num_experts=4)),
}
MOE.update({f"{k}_bf16": (f"{w}, bfloat16 weights", _bfloat16(b)) for k, (w, b) in list(MOE.items())})
MODELS.update(MOE)

# state-space models (issue 48): Mamba's selective scan (kernels/ssm) and causal conv1d; the
# default use_cache=True, so the scan also returns its last state. Named with --models ssm.
SSM = {
    "mamba": ("state-space decoder (selective scan), logits",
              _text("MambaConfig", "MambaForCausalLM", vocab_size=128, hidden_size=64, state_size=8,
                    num_hidden_layers=2)),
    "falcon_mamba": ("state-space decoder (selective scan, RMS-normed B, C, dt), logits",
                     _text("FalconMambaConfig", "FalconMambaForCausalLM", vocab_size=128, hidden_size=64,
                           state_size=8, num_hidden_layers=2)),
}
MODELS.update(SSM)


def _whisper_encoder(**kw):
    """Whisper's audio encoder alone (two 1-D convolutions over log-mel frames, then a
    transformer): input features (batch, mel bins, 2 x max_source_positions frames)."""
    def build():
        import torch
        import transformers as tr

        cfg = tr.WhisperConfig(**kw, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        g = torch.Generator().manual_seed(1)
        feats = torch.randn(BATCH, kw["num_mel_bins"], 2 * kw["max_source_positions"], generator=g)
        return tr.WhisperModel(cfg).get_encoder(), (feats,), dict(HIDDEN)
    return build


# held-out families beyond both zoos (issue 48, helper zoo2): each runs whole on NPU-V3 float16 in
# both modes within TOLERANCE (core 1.25.0: MPT's pow of a number on npu; MobileViT's bilinear resize by
# torch's decomposition, planner/capture.DECOMPOSED_TOO). Named with --models zoo2.
ZOO2 = {
    "gemma2": ("decoder, logit soft-capping, sliding window", _text("Gemma2Config", "Gemma2Model", **DEC, head_dim=16)),
    "gemma3": ("decoder, q/k norm, sliding window", _text("Gemma3TextConfig", "Gemma3TextModel", **DEC, head_dim=16,
                                                            sliding_window=8)),
    "phi3": ("decoder, fused qkv and gate/up", _text("Phi3Config", "Phi3Model", **DEC, pad_token_id=0)),
    "qwen3": ("decoder, q/k RMS norm", _text("Qwen3Config", "Qwen3Model", **DEC, head_dim=16)),
    "stablelm": ("decoder, partial rotary, layer norm", _text("StableLmConfig", "StableLmModel", **DEC)),
    "cohere": ("decoder, parallel attention/MLP, interleaved rotary", _text("CohereConfig", "CohereModel", **DEC)),
    "starcoder2": ("decoder, GQA, biases", _text("Starcoder2Config", "Starcoder2Model", **DEC)),
    "granite": ("decoder, scaled residuals and logits", _text("GraniteConfig", "GraniteModel", **DEC)),
    "olmo2": ("decoder, post-norm, q/k norm", _text("Olmo2Config", "Olmo2Model", **DEC)),
    "gpt_bigcode": ("decoder, multi-query attention", _text("GPTBigCodeConfig", "GPTBigCodeModel", vocab_size=512,
                                                            n_embd=64, n_layer=2, n_head=4, n_positions=128)),
    "mpt": ("decoder, ALiBi (slopes 1 / 2 ** base)", _text("MptConfig", "MptModel", vocab_size=512, d_model=64,
                                                          n_heads=4, n_layers=2, max_seq_len=128)),
    "mamba2": ("state-space decoder, chunked SSD scan", _text("Mamba2Config", "Mamba2Model", vocab_size=128,
                                                                hidden_size=64, state_size=8, num_heads=8, head_dim=16,
                                                                n_groups=1, num_hidden_layers=2, expand=2,
                                                                chunk_size=8)),
    "bart": ("encoder-decoder, learned positions", _seq2seq("BartConfig", "BartModel", vocab_size=512, d_model=64,
                                                           encoder_layers=2, decoder_layers=2,
                                                           encoder_attention_heads=4, decoder_attention_heads=4,
                                                           encoder_ffn_dim=128, decoder_ffn_dim=128,
                                                           max_position_embeddings=128)),
    "whisper_enc": ("audio encoder, 1-D convs over log-mel frames",
                    _whisper_encoder(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                     decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=16,
                                     max_target_positions=32)),
    "dinov2": ("vision encoder, layer scale", _image("Dinov2Config", "Dinov2Model", **_V)),
    "segformer": ("vision, overlapping patches, reduced-sequence attention, mix-FFN",
                  _image("SegformerConfig", "SegformerModel", num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                         hidden_sizes=[16, 32], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2],
                         mlp_ratios=[2, 2])),
    "deberta_v2": ("encoder, disentangled relative attention", _text("DebertaV2Config", "DebertaV2Model", **TXT)),
    "beit": ("vision encoder, relative position bias", _image("BeitConfig", "BeitModel", **_V)),
    "mobilevit": ("conv net + transformer blocks, bilinear resize of features",
                  _image("MobileViTConfig", "MobileViTModel", image_size=32, hidden_sizes=[32, 48, 64],
                         neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 80])),
    # whole on the chip in both modes (core 1.25.0-1.26.0), but its router runs in float32 by design
    # (hidden states and gate cast up): on a float16-only chip (NPU-V3) top-k flips between close
    # experts and the output is 5.6e-2 off (CPU float16 with the float32 router: 7e-4); float32
    # (TFL-X1) within 1e-4
    "deepseek_v3": ("MoE decoder, multi-head latent attention, grouped sigmoid routing, shared expert",
                    _text("DeepseekV3Config", "DeepseekV3Model", vocab_size=512, hidden_size=64, intermediate_size=128,
                          moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                          n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                          qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=128)),
}
MODELS.update(ZOO2)


def _float_tensors(out) -> list:
    """Every floating tensor of a model's output (ModelOutput, tuple, cache objects skipped)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _float_tensors(o)]
    return []


def _rel_error(got, ref) -> float:
    """Max over the output tensors of max |ours - eager| / max(1, max |eager|), per tensor."""
    worst = 0.0
    for a, b in zip(_float_tensors(got), _float_tensors(ref)):
        if b.numel() == 0:
            continue
        a, b = a.detach().float(), b.detach().float()
        scale = max(1.0, float(b.abs().nan_to_num(0, 0, 0).max()))
        worst = max(worst, float((a - b).abs().max()) / scale)
    return worst


def _first_tensor(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, (tuple, list)):
        return _first_tensor(out[0])
    if isinstance(out, dict):
        return _first_tensor(next(iter(out.values())))
    raise TypeError(f"no tensor in {type(out).__name__}")


def _build(build, rec):
    """``build()`` from seed 0: (model, inputs, kwargs), or None with ``rec["error_message"]`` set."""
    import torch

    torch.manual_seed(0)
    try:
        return build()
    except Exception as exc:  # a family this transformers version builds differently
        rec["error_message"] = f"building the model: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        return None


def run_one(name, chip, precision, runs, strict=False, train=False):
    """One (model, chip) compiled: fallbacks, error vs eager, times; ``train``: and its
    gradients (:func:`train_compiled`)."""
    import torch

    from torchfl.runtime.backend import recording

    what, build = MODELS[name]
    rec = {"model": name, "what": what, "chip": chip, "precision": precision}
    built = _build(build, rec)
    if built is None:
        return rec
    model, inputs, kwargs = built
    model = model.eval()
    with torch.no_grad():
        ref = model(*inputs, **kwargs)
        eager = []
        for _ in range(runs):
            t0 = time.perf_counter()
            model(*inputs, **kwargs)
            eager.append(time.perf_counter() - t0)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="torchfl",
                                 options={"chip": chip, "precision": precision, "strict": strict})
        try:
            with recording() as r:
                t0 = time.perf_counter()
                out = compiled(*inputs, **kwargs)
                rec["compile_s"] = round(time.perf_counter() - t0, 3)
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                compiled(*inputs, **kwargs)
                times.append(time.perf_counter() - t0)
        except Exception as exc:  # a benchmark reports what failed and goes on
            rec["error_message"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            rec["traceback_tail"] = traceback.format_exc().splitlines()[-4:-1]
            return rec
    plans = [plan for _cg, plan, _r in r.entries]
    falls = [f for p in plans for f in p.fallbacks]
    ops = {}
    for f in falls:
        ops[f.op] = ops.get(f.op, 0) + 1
    reasons = {}
    for f in falls:
        reasons.setdefault(f.op, f.reason)
    err = _rel_error(out, ref)
    rec.update(graphs=len(plans), nodes=sum(p.summary.nodes_total for p in plans),
               fallbacks=len(falls), fallback_ops=dict(sorted(ops.items(), key=lambda kv: -kv[1])),
               fallback_reasons=reasons, folded=sum(len(p.folded) for p in plans),
               decomposed=sum(1 for p in plans for s in p.steps if "decomposed" in (s.note or "")),
               error=err, tolerance=TOLERANCE[precision], within_tolerance=bool(err <= TOLERANCE[precision]),
               run_s=round(statistics.median(times), 4), eager_s=round(statistics.median(eager), 4))
    if train:
        rec.update(train_compiled(name, chip, precision))
    return rec


def run_one_eager(name, chip, index, precision, runs, train_index=None):
    """``name`` on the eager device ``npu:index`` (the chip ``chip``) in ``precision``; with
    ``train_index``, a training step on ``npu:train_index`` too (:func:`train_step`)."""
    import torch

    from torchfl.runtime.eager import ops

    what, build = MODELS[name]
    rec = {"model": name, "what": what, "chip": chip, "precision": precision, "mode": "eager"}
    built = _build(build, rec)
    if built is None:
        return rec
    model, inputs, kwargs = built
    model = model.eval()
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, None: torch.float32}[precision]
    dev = f"npu:{index}"

    def move(t):
        if isinstance(t, torch.Tensor):
            return t.to(dev, dtype=dtype) if t.is_floating_point() else t.to(dev)
        return t

    with torch.no_grad():
        ref = _first_tensor(model(*inputs, **kwargs)).float()
        eager = []
        for _ in range(runs):
            t0 = time.perf_counter()
            model(*inputs, **kwargs)
            eager.append(time.perf_counter() - t0)
    try:
        npu = model.to(dev, dtype=dtype)
        n_in = tuple(move(t) for t in inputs)
        n_kw = {k: move(v) for k, v in kwargs.items()}
        with torch.no_grad():
            before = ops.ROUTES.copy()
            in_graphs = ops.STATS["lazy_fallback_nodes"]
            t0 = time.perf_counter()
            out = _first_tensor(npu(*n_in, **n_kw)).cpu().float()
            rec["compile_s"] = round(time.perf_counter() - t0, 3)
            falls = {op: n - before.get((op, route), 0) for (op, route), n in ops.ROUTES.items()
                     if route == "host fallback" and n > before.get((op, route), 0)}
            if ops.STATS["lazy_fallback_nodes"] > in_graphs:     # --lazy: host steps inside the graphs
                falls["(nodes of lazy graphs)"] = ops.STATS["lazy_fallback_nodes"] - in_graphs
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                _first_tensor(npu(*n_in, **n_kw)).cpu()
                times.append(time.perf_counter() - t0)
    except Exception as exc:  # a benchmark reports what failed and goes on
        rec["error_message"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        rec["traceback_tail"] = traceback.format_exc().splitlines()[-4:-1]
        return rec
    scale = max(1.0, float(ref.abs().nan_to_num(0, 0, 0).max())) if ref.numel() else 1.0
    err = float((out - ref).abs().max()) / scale if ref.numel() else 0.0
    rec.update(fallbacks=sum(falls.values()), fallback_ops=dict(sorted(falls.items(), key=lambda kv: -kv[1])),
               error=err, tolerance=TOLERANCE[precision], within_tolerance=bool(err <= TOLERANCE[precision]),
               run_s=round(statistics.median(times), 4) if times else None,
               eager_s=round(statistics.median(eager), 4) if eager else None)
    if train_index is not None:
        torch.manual_seed(0)
        model, inputs, kwargs = build()
        dev = f"npu:{train_index}"
        rec["train_device"] = f"{dev} ({torch.npu.get_device_name(train_index)})"
        move = lambda t: t.to(dev) if isinstance(t, torch.Tensor) else t   # noqa: E731
        saved = os.environ.pop("TORCHFL_PRECISION", None)
        try:
            rec.update(train_step(model.to(dev), tuple(move(t) for t in inputs),
                                  {k: move(v) for k, v in kwargs.items()}))
        finally:
            if saved is not None:
                os.environ["TORCHFL_PRECISION"] = saved
    return rec


#: a static loss scale for float16 training (GradScaler's idea, without its search): a mean
#: loss's gradients (1/numel each) underflow float16 in deep models (MobileNetV2's are 1e-7 ..
#: 1e-12 in float32); 2^10 keeps them above float16's subnormals, below its overflow in the zoo
LOSS_SCALE = {"float16": 1024.0}


def train_compiled(name, chip, precision):
    """The gradients of one compiled forward and backward (``--mode compile --train``) against
    eager torch float32's on the same model, inputs and loss ``mean(out * r)`` (``r`` a fixed
    random tensor: a well-conditioned loss; ``mean(out^2)`` after a layer norm is constant up
    to rounding, so its input gradient is noise), times :data:`LOSS_SCALE` on the chip and
    divided out of its gradients. Eval mode (dropout off: both sides must
    compute the same function), gradients enabled: AOTAutograd's forward and backward graphs,
    both planned and run on the chip. ``train_grad_error``: max |ours - eager| over every
    parameter gradient / the largest |eager| gradient (one scale for the model: a parameter
    whose gradient is ~0, an unused embedding row or a layer norm's invariant direction, has
    only rounding noise to compare), within ``TOLERANCE[precision]``."""
    import copy

    import torch

    rec = {}
    built = _build(MODELS[name][1], rec)
    if built is None:
        return {"train_ok": False, "train_error": rec["error_message"]}
    model, inputs, kwargs = built
    model = model.eval()
    ref = copy.deepcopy(model)
    want = _first_tensor(ref(*inputs, **kwargs)).float()
    r = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    (want * r).mean().backward()
    torch._dynamo.reset()
    try:
        t0 = time.perf_counter()
        compiled = torch.compile(model, backend="torchfl", options={"chip": chip, "precision": precision})
        scale = LOSS_SCALE.get(precision, 1.0)
        (_first_tensor(compiled(*inputs, **kwargs)).float() * r).mean().mul(scale).backward()
        took = time.perf_counter() - t0
    except Exception as exc:  # reported, as a forward failure is
        return {"train_ok": False, "train_error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}",
                "traceback_tail": traceback.format_exc().splitlines()[-4:-1]}
    pairs = [(None if p.grad is None else p.grad.float() / scale, q.grad)
             for p, q in zip(model.parameters(), ref.parameters()) if q.grad is not None]
    missing = sum(g is None for g, _w in pairs)
    largest = max((float(w.abs().max()) for _g, w in pairs if w.numel()), default=0.0) or 1.0
    err = max((float((g - w).abs().max()) for g, w in pairs if g is not None and w.numel()), default=0.0)
    err /= largest
    ok = missing == 0 and bool(pairs) and err <= TOLERANCE[precision]
    return {"train_ok": ok, "train_grads": len(pairs) - missing, "train_missing_grads": missing,
            "train_grad_error": err, "train_s": round(took, 3)}


def train_step(model, inputs, kwargs):
    """One forward (autocast float16), backward and SGD step of float32 ``model`` on its npu
    device with the loss ``mean(out^2)`` (float32): whether it ran with finite gradients
    and finite parameters after the step; host-fallback calls in it."""
    import torch

    from torchfl.runtime.eager import ops

    model.train()
    before = ops.ROUTES.copy()
    try:
        params = [p for p in model.parameters() if p.requires_grad]
        old = [p.detach().cpu().clone() for p in params]
        opt = torch.optim.SGD(params, lr=1e-2)
        opt.zero_grad()
        t0 = time.perf_counter()
        with torch.autocast("npu", dtype=torch.float16):
            out = _first_tensor(model(*inputs, **kwargs))
        loss = out.float().square().mean()
        loss.backward()
        opt.step()
        took = time.perf_counter() - t0
        grads = [p.grad for p in params if p.grad is not None]
        finite = all(bool(torch.isfinite(g.cpu()).all()) for g in grads)
        moved = [not torch.equal(o, p.detach().cpu()) for o, p in zip(old, params) if p.grad is not None]
        new_ok = all(bool(torch.isfinite(p.detach().cpu()).all()) for p in params)
    except Exception as exc:  # reported, as a forward failure is
        return {"train_ok": False, "train_error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}",
                "traceback_tail": traceback.format_exc().splitlines()[-4:-1]}
    finally:
        model.eval()
    falls = {op: n - before.get((op, route), 0) for (op, route), n in ops.ROUTES.items()
             if route == "host fallback" and n > before.get((op, route), 0)}
    return {"train_ok": bool(finite and new_ok and grads),
            "train_grads": len(grads), "train_params_moved": int(sum(moved)), "train_loss": float(loss),
            "train_fallbacks": sum(falls.values()), "train_fallback_ops": falls, "train_s": round(took, 3)}


def _print_line(r):
    m, c = r["model"], r["chip"]
    if "error_message" in r:
        print(f"{m:13s} {c:7s} ERROR {r['error_message']}", flush=True)
        return
    ops = ", ".join(f"{k.replace('aten.', '')} x{v}" for k, v in r["fallback_ops"].items())
    train = ""
    if "train_ok" in r:
        grad = f" (gradients {r['train_grad_error']:.1e})" if "train_grad_error" in r else ""
        train = (f" train {'ok' if r['train_ok'] else 'FAILED ' + r.get('train_error', '')}{grad}"
                 f"{' fallbacks ' + str(r['train_fallbacks']) if r.get('train_fallbacks') else ''}")
    print(f"{m:13s} {c:7s} fallbacks {r['fallbacks']:3d} err {r['error']:.1e}"
          f"{'' if r['within_tolerance'] else ' (!)'} compile {r['compile_s']:6.2f}s "
          f"run {r['run_s'] * 1e3:7.1f}ms eager {r['eager_s'] * 1e3:6.1f}ms"
          f"{' decomposed ' + str(r['decomposed']) if r.get('decomposed') else ''}{train}  {ops}",
          flush=True)


def _swept(models, chips, a):
    """Every (model, chip) as a unit of a recorded sweep (torchfl.cluster), in the order asked."""
    from torchfl.cluster.options import reported, require_ray, runner as make_runner
    from torchfl.cluster.sweep import run_sweep
    from torchfl.cluster.units import Unit
    from torchfl.registry import Registry

    require_ray(a.cluster)
    echo = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    units = [Unit(f"{m} {c}", run_one, (m, c, CHIPS[c], a.runs, a.strict)) for m in models for c in chips]
    spec = dict(tool="bench_zoo", models=models, chips=chips, runs=a.runs, strict=a.strict)
    runner, state = make_runner(a.cluster, 1, echo=echo), {}
    with reported(lambda: state.get("sweep")):
        try:
            got = run_sweep(runner, "bench_zoo", f"bench_zoo {len(models)} models x {len(chips)} chips", spec, units,
                            registry=Registry(a.registry), resume=a.resume, echo=echo, state=state,
                            on_done=None if a.json else (lambda done: _print_line(done.result)))
        finally:
            runner.close()
    return [got[u.key] for u in units]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help=f"comma-separated subset, or 'hf' for the {len(HF)} Hugging Face families, "
                                     f"'moe' for the {len(MOE)} mixture-of-experts ones, 'ssm' for the state-space ones, 'zoo2' for the "
                                     f"{len(ZOO2)} held-out families of issue 48 "
                                     f"(default: all but resnet50 and those): {', '.join(MODELS)}")
    ap.add_argument("--chips", help=f"comma-separated subset of {', '.join(CHIPS)}")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--strict", action="store_true", help="compile with strict=True (fallbacks are errors)")
    ap.add_argument("--mode", choices=("compile", "eager"), default="compile",
                    help="torch.compile(backend='torchfl') (default), or the eager npu device")
    ap.add_argument("--train", action="store_true", help="also train: eager mode a forward, backward and SGD step; "
                                                         "compile mode the gradients against eager torch's")
    ap.add_argument("--lazy", action="store_true", help="eager mode in lazy mode (TORCHFL_LAZY=1: each forward one "
                                                        "recorded graph, planned with fusion)")
    ap.add_argument("--train-chip", default="TFL-X1", help="the chip of --train's step (float32 weights, "
                                                         "autocast float16): default TFL-X1")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--cluster", metavar="ADDRESS",
                    help="run each (model, chip) as a Ray task on the cluster at ADDRESS (HOST:PORT or auto)")
    ap.add_argument("--resume", type=int, metavar="RUN", help="finish the recorded sweep run RUN")
    ap.add_argument("--registry", metavar="URL", help="where --cluster/--resume record the sweep")
    a = ap.parse_args(argv)
    if a.list:
        for k, (what, _b) in MODELS.items():
            print(f"{k:14s} {what}")
        return 0
    models = HF if a.models == "hf" else list(MOE) if a.models == "moe" else list(SSM) if a.models == "ssm" else \
        list(ZOO2) if a.models == "zoo2" else (
        a.models.split(",") if a.models else DEFAULT)
    chips = a.chips.split(",") if a.chips else list(CHIPS)
    bad = [m for m in models if m not in MODELS] + [c for c in chips if c not in CHIPS]
    if bad:
        ap.error(f"unknown model/chip {', '.join(bad)}; models: {', '.join(MODELS)}; chips: {', '.join(CHIPS)}")
    if a.lazy and a.mode != "eager":
        ap.error("--lazy needs --mode eager")
    if a.lazy:
        os.environ["TORCHFL_LAZY"] = "1"
    swept = a.cluster is not None or a.resume is not None
    if swept and a.mode != "compile":
        ap.error("--cluster/--resume run --mode compile only (the eager device is set up per process)")
    if a.mode == "eager":
        os.environ["TORCHFL_DEVICES"] = ",".join(chips + ([a.train_chip] if a.train else []))
        if len({CHIPS[c] for c in chips}) > 1:
            ap.error("--mode eager runs chips of one precision per process (TORCHFL_PRECISION); "
                     f"these need {', '.join(sorted({str(CHIPS[c]) for c in chips}))}: run them separately")
        if CHIPS[chips[0]]:
            os.environ["TORCHFL_PRECISION"] = CHIPS[chips[0]]
        if a.strict:
            os.environ["TORCHFL_STRICT"] = "1"
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("torchfl").setLevel(logging.ERROR)
    if a.mode == "eager":
        from torchfl.runtime import eager

        eager.register()
        eager.ensure_adapter()
    if swept:
        results = _swept(models, chips, a)
    else:
        results = []
        for m in models:
            for c in chips:
                if a.mode == "eager":
                    r = run_one_eager(m, c, chips.index(c), CHIPS[c], a.runs, len(chips) if a.train else None)
                else:
                    r = run_one(m, c, CHIPS[c], a.runs, a.strict, a.train)
                results.append(r)
                if not a.json:
                    _print_line(r)
    summary = {}
    for c in chips:
        rs = [r for r in results if r["chip"] == c]
        summary[c] = {"models": len(rs), "errors": sum("error_message" in r for r in rs),
                      "zero_fallbacks": sum(r.get("fallbacks") == 0 for r in rs),
                      "within_tolerance": sum(bool(r.get("within_tolerance")) for r in rs)}
        if a.train:
            summary[c]["train_ok"] = sum(bool(r.get("train_ok")) for r in rs)
    load = os.getloadavg()
    if a.json:
        print(json.dumps({"results": results, "summary": summary, "loadavg": load}, indent=1))
    else:
        for c, s in summary.items():
            print(f"{c} ({a.mode}): {s['zero_fallbacks']}/{s['models']} with zero fallbacks, {s['within_tolerance']} "
                  f"within tolerance, {s['errors']} errors"
                  f"{', ' + str(s['train_ok']) + ' trained a step' if 'train_ok' in s else ''}")
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
