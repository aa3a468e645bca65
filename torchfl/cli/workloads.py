"""The demo's models and chips: what ``torchfl demo`` runs and ``torchfl kernels warmup``
compiles ahead of time (one definition, so the warmed kernels are the ones the demo uses)."""

from __future__ import annotations

CHIPS = ("NPU-V2", "NPU-V3")
PRECISION = "float16"


def models(quick: bool = False):
    """(key, title, factory) triples; factories return (module, inputs)."""
    from torchfl.planner.zoo import load_model

    image = 64 if quick else 224
    seq = 32 if quick else 128
    return (
        ("resnet50", f"ResNet-50 (batch 1, {image}x{image})",
         lambda: load_model("resnet50", batch=1, image=image)),
        # 8 heads: the attention units of both chips run it (NPU-V2: 1-8 heads, NPU-V3: up to 16)
        ("bert-layer", f"BERT encoder layer (hidden 768, 8 heads, seq {seq})",
         lambda: load_model("bert-base", batch=1, seq_len=seq, layers=1, num_heads=8)),
    )


def zoo_model(name: str):
    """A (key, title, factory) triple for a zoo model at its default size (``kernels warmup --model``)."""
    from torchfl.planner.zoo import load_model

    return (name, name, lambda: load_model(name))


def compile_model(module, chip: str, registry, precision: str = PRECISION):
    """The demo's one torch.compile call (warmup's kernels must match the demo's options)."""
    import torch

    return torch.compile(module, backend="torchfl",
                         options={"chip": chip, "precision": precision, "registry": registry})


def first_tensor(out):
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, (tuple, list)):
        return first_tensor(out[0])
    if isinstance(out, dict):
        return first_tensor(next(iter(out.values())))
    raise TypeError(f"no tensor in the model's output {type(out).__name__}")
