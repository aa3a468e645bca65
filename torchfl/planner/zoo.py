"""Built-in models for ``torchfl plan explain MODEL``: each factory returns (module, inputs).

ResNets are written here (torchvision is not a dependency); BERT and GPT-2 are Hugging Face
transformers models built offline from their configs (random weights, nothing downloaded).
Factories take ``batch``, the options that mean something for them (``seq_len``, ``layers``,
``num_heads`` for transformers; ``image`` for ResNets) and a few size knobs so tests can use
small configurations; an option a model does not take is refused. ``load_model("path/to/file.py:factory")`` loads a user's.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from pathlib import Path


class ModelError(ValueError):
    """Unknown model name or a factory that cannot be loaded (message lists the choices)."""


def _mlp(batch=8, width=1024, depth=3):
    from torch import nn
    import torch

    layers = []
    for _i in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    torch.manual_seed(0)
    return nn.Sequential(*layers).eval(), (torch.randn(batch, width),)


def _resnet_classes():
    from torch import nn

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, cin, planes, stride=1):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU()
            self.downsample = None
            if stride != 1 or cin != planes:
                self.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin, planes, stride=1):
            super().__init__()
            width = planes
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU()
            self.downsample = None
            if stride != 1 or cin != planes * 4:
                self.downsample = nn.Sequential(nn.Conv2d(cin, planes * 4, 1, stride, bias=False),
                                                nn.BatchNorm2d(planes * 4))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + identity)

    class ResNet(nn.Module):
        """The torchvision ResNet topology (He et al. 2015), re-written without torchvision."""

        def __init__(self, block, layers, num_classes=1000, width=64):
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            cin, stages = width, []
            for i, n in enumerate(layers):
                planes = width * 2**i
                blocks = []
                for j in range(n):
                    blocks.append(block(cin, planes, 2 if (j == 0 and i > 0) else 1))
                    cin = planes * block.expansion
                stages.append(nn.Sequential(*blocks))
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return BasicBlock, Bottleneck, ResNet


def _resnet(kind, batch=1, image=224):
    import torch

    basic, bottleneck, resnet = _resnet_classes()
    torch.manual_seed(0)
    model = resnet(basic, [2, 2, 2, 2]) if kind == 18 else resnet(bottleneck, [3, 4, 6, 3])
    return model.eval(), (torch.randn(batch, 3, image, image),)


def _transformers(model: str):
    """transformers, or a ModelError with the one-line install hint (the ``models`` extra)."""
    try:
        import transformers
    except ModuleNotFoundError:
        raise ModelError(f"{model} is built with Hugging Face transformers, which is not installed: "
                         "pip install 'torchfl[models]'") from None
    return transformers


def _bert(size, batch=1, seq_len=128, layers=None, num_heads=None, hidden=None):
    import torch

    tf = _transformers(f"bert-{size}")
    BertConfig, BertModel = tf.BertConfig, tf.BertModel

    base = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    if size == "large":
        base = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    if hidden:
        base.update(hidden_size=hidden, intermediate_size=4 * hidden)
    if layers:
        base["num_hidden_layers"] = layers
    if num_heads:
        base["num_attention_heads"] = num_heads
    config = BertConfig(**base, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = BertModel(config, add_pooling_layer=False).eval()
    return model, (torch.randint(0, config.vocab_size, (batch, seq_len)),)


def _gpt2(batch=1, seq_len=128, layers=None, num_heads=None, hidden=None):
    import torch

    tf = _transformers("gpt2")
    GPT2Config, GPT2Model = tf.GPT2Config, tf.GPT2Model

    kw = dict(use_cache=False, attn_implementation="sdpa")
    if layers:
        kw["n_layer"] = layers
    if num_heads:
        kw["n_head"] = num_heads
    if hidden:
        kw["n_embd"] = hidden
    config = GPT2Config(**kw)
    torch.manual_seed(0)
    model = GPT2Model(config).eval()
    return model, (torch.randint(0, config.vocab_size, (batch, seq_len)),)


def _llama(size, batch=1, seq_len=8, layers=None):
    """LLaMA-2 7B / 70B, default config (use_cache=True), on the meta device (planner.lm)."""
    from torchfl.planner.lm import llama

    return llama(size, batch=batch, seq_len=seq_len, layers=layers)


def _tiny_llama(batch=1, seq_len=8, layers=None):
    """A 2-layer LLaMA with random weights, default config otherwise (planner.lm)."""
    from torchfl.planner.lm import tiny_llama

    return tiny_llama(batch=batch, seq_len=seq_len, layers=layers)


def _mixtral(batch=1, seq_len=8, layers=None):
    """Mixtral 8x7B: transformers' default MixtralConfig (the published mistralai/Mixtral-8x7B
    sizes: hidden 4096, 32 layers, 8 experts of MLP width 14336, 2 per token, 32 query and 8
    key/value heads), bfloat16 weights (the published dtype; transformers' grouped experts then
    capture as torch._grouped_mm, core's grouped_mm kernel), on the meta device: no weights in RAM.
    Memory holds all 8 experts of each layer; a decode step reads at most 2 (the plan explain of a
    grouped_mm step gives the range of experts and bytes over the routings)."""
    import torch

    from torchfl.kernels.grouped.torchop import register

    register()      # torch.ops.torchfl.grouped_mm: the catalog may have loaded before torch
    tf = _transformers("mixtral-8x7b")
    config = tf.MixtralConfig(**({"num_hidden_layers": layers} if layers else {}))
    with torch.device("meta"):
        model = tf.MixtralForCausalLM(config).to(torch.bfloat16).eval()
    return model, (torch.zeros((batch, seq_len), dtype=torch.long, device="meta"),)


ZOO = {
    "mlp": _mlp,
    "resnet18": functools.partial(_resnet, 18),
    "resnet50": functools.partial(_resnet, 50),
    "bert-base": functools.partial(_bert, "base"),
    "bert-large": functools.partial(_bert, "large"),
    "gpt2": _gpt2,
}

# causal language models: accepted by name, not in ZOO (``plan impact --models zoo`` and the
# zoo benchmarks iterate ZOO; a 70B plan is not one of their quick checks)
LM_ZOO = {
    "llama-7b": functools.partial(_llama, "7b"),
    "llama-70b": functools.partial(_llama, "70b"),
    "tiny-llama": _tiny_llama,
    "mixtral-8x7b": _mixtral,       # mixture of experts (issue 48)
}


def _check_options(spec: str, factory, options: dict, labels: dict | None) -> dict:
    """The options ``factory`` takes; an option it does not take is an error, not ignored
    (``--heads`` on an MLP would otherwise plan something else than the user asked for)."""
    params = inspect.signature(factory).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return options
    takes = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    wrong = [k for k in options if k not in takes]
    if wrong:
        name = (labels or {}).get
        accepted = [name(k, k) for k in takes if name(k, None) is not None or labels is None]
        verb = "does" if len(wrong) == 1 else "do"
        raise ModelError(f"{', '.join(name(k, k) for k in wrong)} {verb} not apply to {spec}: it takes "
                         + (", ".join(accepted) if accepted else "no options")
                         + ("; leave the option out" if len(wrong) == 1 else "; leave these options out"))
    return options


def load_model(spec: str, *, labels: dict | None = None, **options):
    """``(module, example_inputs)`` for a zoo name or ``path/to/file.py:factory``.

    Options (``batch``, ``seq_len``, ...) left as ``None`` are not passed; one the model does
    not take raises :class:`ModelError` (a factory with ``**kwargs`` takes every option).
    ``labels`` maps option names to how the caller spelled them (``num_heads`` -> ``--heads``).
    """
    options = {k: v for k, v in options.items() if v is not None}
    if spec in ZOO or spec in LM_ZOO:
        factory = ZOO.get(spec) or LM_ZOO[spec]
        return factory(**_check_options(spec, factory, options, labels))
    if ":" in spec and spec.rsplit(":", 1)[0].endswith(".py"):
        path_text, name = spec.rsplit(":", 1)
        path = Path(path_text)
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist (MODEL is a zoo name or path/to/file.py:factory)")
        module_spec = importlib.util.spec_from_file_location(f"torchfl_user_model_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - a user's file may raise anything: a ModelError with its message
            raise ModelError(f"could not load {path}: {type(exc).__name__}: {exc}") from exc
        factory = getattr(module, name, None)
        if not callable(factory):
            raise ModelError(f"{path} has no callable {name!r}; define `def {name}(): return module, example_inputs`")
        result = factory(**_check_options(spec, factory, options, labels))
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ModelError(f"{spec} must return (module, example_inputs), got {type(result).__name__}")
        module_obj, inputs = result
        return module_obj, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    raise ModelError(f"unknown model {spec!r}; choose one of {', '.join([*ZOO, *LM_ZOO])} or path/to/file.py:factory")
