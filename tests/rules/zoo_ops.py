"""List the ATen ops of the model zoo's real graphs (ResNet-50, BERT, GPT-2).

Run ``python tests/rules/zoo_ops.py [--json]``. The core pack must have a rule for every
op printed here, or list it in ``rules/core.yaml``'s ``no_rule`` section with the reason;
``test_zoo_coverage.py`` checks that against freshly captured graphs. Three captures, as
the planner makes them (see FINDINGS.md "Graph capture"):

- ``export``: ``torch.export`` + ``run_decompositions(default_decompositions())``
  (everything in core ATen),
- ``export-keep``: the same but keeping sdpa / linear / layer_norm / conv2d / gelu,
- ``train``: ``aot_autograd`` with ``core_aten_decompositions()``, forward and backward.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

KEEP = (
    "scaled_dot_product_attention.default",
    "linear.default",
    "layer_norm.default",
    "conv2d.default",
    "convolution.default",
    "gelu.default",
)  # the same as torchfl.planner.capture.KEEP_OPS


def resnet50(num_classes: int = 10, blocks=(3, 4, 6, 3)):
    """Torchvision-shaped ResNet-50 (bottleneck 3-4-6-3), written here: no torchvision.

    ``blocks=(1, 1, 1, 1)`` gives the same op set (every stage keeps its downsampling
    bottleneck) in a quarter of the capture time; the tests use it.
    """
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            idt = x if self.down is None else self.down(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return self.relu(y + idt)

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, count, stride in zip((64, 128, 256, 512), blocks, (1, 2, 2, 2)):
        for i in range(count):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    return nn.Sequential(*layers)


def zoo(small: bool = False):
    """(name, model, example inputs) for each zoo model, small enough to capture quickly."""
    import torch
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    torch.manual_seed(0)
    bert = BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=128, vocab_size=100, max_position_embeddings=64))
    gpt2 = GPT2Model(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=64,
                                use_cache=False))
    gpt2_eager = GPT2Model(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=64,
                                      use_cache=False, attn_implementation="eager"))
    ids = torch.randint(0, 100, (2, 16))
    return [
        ("resnet50", resnet50(blocks=(1, 1, 1, 1) if small else (3, 4, 6, 3)), (torch.randn(2, 3, 64, 64),)),
        ("bert", bert, (ids,)),
        ("gpt2", gpt2, (ids,)),
        ("gpt2-eager", gpt2_eager, (ids,)),
    ]


def graphs(models=None):
    """Yield ("model/mode", GraphModule) for every zoo model and capture mode; failures go to FAILURES."""
    import torch
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_module_simplified

    for name, model, inputs in models or zoo():
        model.eval()
        table = torch.export.default_decompositions()
        for k in KEEP:
            packet, overload = k.split(".")
            table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
        for mode, tab in (("export", torch.export.default_decompositions()), ("export-keep", table)):
            try:
                gm = torch.export.export(model, inputs).run_decompositions(tab).graph_module
            except Exception as exc:  # noqa: BLE001 - recorded, the test decides
                FAILURES.append(f"{name}/{mode}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                continue
            yield f"{name}/{mode}", gm

        model.train()
        grabbed = []

        def compiler(tag):
            def fn(gm, _example):
                grabbed.append((f"{name}/{tag}", gm))
                return gm.forward
            return fn

        def backend(gm, example_inputs):
            return aot_module_simplified(gm, example_inputs, fw_compiler=compiler("train-fw"),
                                         bw_compiler=compiler("train-bw"),
                                         decompositions=core_aten_decompositions())

        torch._dynamo.reset()
        try:
            out = torch.compile(model, backend=backend)(*inputs)
            out = out if isinstance(out, torch.Tensor) else out[0]
            out.float().sum().backward()
        except Exception as exc:  # noqa: BLE001 - recorded, the test decides
            FAILURES.append(f"{name}/train: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        yield from grabbed


def op_name(target) -> str:
    if hasattr(target, "_schema"):
        return f"aten.{target._schema.name.split('::')[1]}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def capture(models=None):
    """Map op name -> set of 'model/mode' tags where it appears."""
    ops: dict[str, set[str]] = defaultdict(set)
    for tag, gm in graphs(models):
        for node in gm.graph.nodes:
            if node.op == "call_function":
                ops[op_name(node.target)].add(tag)
    return ops


FAILURES: list[str] = []


def schemas(names):
    import torch

    result = {}
    for name in names:
        _, base, overload = name.split(".")
        try:
            result[name] = str(getattr(getattr(torch.ops.aten, base), overload)._schema)
        except AttributeError:
            result[name] = None
    return result


if __name__ == "__main__":
    found = capture()
    if "--json" in sys.argv:
        sch = schemas([n for n in found if n.startswith("aten.")])
        print(json.dumps({k: {"where": sorted(v), "schema": sch.get(k)} for k, v in sorted(found.items())}, indent=1))
        print(FAILURES, file=sys.stderr)
    else:
        for k, v in sorted(found.items()):
            print(k, " ".join(sorted(v)))
