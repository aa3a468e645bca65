"""Repeated decoder layers captured once: a deep language model traced as a two-layer twin, its
second layer's nodes copied for every further layer.

Why: ``torch.export`` (and its ``run_decompositions`` re-trace) costs time in proportion to the
nodes it traces; a LLaMA-2 7B decode step (32 identical layers, ~2300 nodes) took ~45 s of a
55 s what-if probe at a quiet moment, 70B (80 layers) more than twice that. Every layer of such
a model traces to the same nodes on its own weights and its own cache, so tracing two is enough.

How (:func:`twin_of`, :func:`expand`):

* the twin is the same class built on the meta device from the same config with two layers;
  it is made only for a model on the meta device (no weights to bind: what-if planning) whose
  layers are all of one class with equal parameter shapes and dtypes, and one layer type;
* after capture, the nodes of layer 1 (the template; read from each node's
  ``nn_module_stack``) take one value from layer 0 (the hidden state: the *carry*), their own
  parameters, their own cache inputs and values computed before the layers (positions, masks);
  they give one value to what follows (the carry) and their cache outputs to the graph output;
* layers 2..N-1 are copies of the template, each on the previous copy's carry, with new
  parameter placeholders (``layers.<i>.`` in the name and target) and new cache inputs; the
  final norm reads the last copy's carry; the cache outputs follow layer order.

A graph that does not have this shape (a node outside the template reads the template's
values, two carries, a layer-specific constant) is not expanded: :func:`expand` returns None
and the caller captures the whole model as before. ``tests/lm/test_repeat.py`` checks that
the expanded graph has the same ops, shapes and plan as the model captured whole.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

__all__ = ["Twin", "twin_of", "expand", "layer_of"]

TEMPLATE = 1          # the layer copied (0 is the one before it)
MIN_LAYERS = 4        # fewer: nothing to save


@dataclass
class Twin:
    """A shallow twin of a wrapped causal LM: capture ``module`` on ``inputs`` (and
    ``shapes``), then :func:`expand` to ``layers``."""

    module: object
    inputs: tuple
    shapes: object
    layers: int


def _lm_of(module):
    """The Hugging Face causal LM inside ``module`` (planner.lm's DecodeStep/Prefill), and
    which wrapper it is ("decode", "prefill"), or (None, None)."""
    lm = getattr(module, "lm", None)
    kind = type(module).__name__
    if lm is None or kind not in ("DecodeStep", "Prefill"):
        return None, None
    return lm, "decode" if kind == "DecodeStep" else "prefill"


def _homogeneous(lm) -> bool:
    layers = getattr(getattr(lm, "model", None), "layers", None)
    n = getattr(lm.config, "num_hidden_layers", None)
    if layers is None or n is None or len(layers) != n or n < MIN_LAYERS:
        return False
    types = getattr(lm.config, "layer_types", None)
    if types is not None and len(set(types)) > 1:
        return False
    first = [(k, tuple(p.shape), p.dtype) for k, p in layers[0].named_parameters()]
    return all(type(layer) is type(layers[0]) and
               [(k, tuple(p.shape), p.dtype) for k, p in layer.named_parameters()] == first for layer in layers)


def twin_of(module, inputs, shapes=None) -> Twin | None:
    """A two-layer twin of a meta-device decoder wrapper, its inputs cut to two layers' cache
    (``shapes``: torch.export's dynamic_shapes of the wrapper, cut alike), or None where the
    model is not one this applies to (module docstring)."""
    import torch

    lm, kind = _lm_of(module)
    if lm is None or not all(p.is_meta for p in lm.parameters()) or not _homogeneous(lm):
        return None
    config = copy.deepcopy(lm.config)
    config.num_hidden_layers = 2
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types)[:2]
    dtype = next(lm.parameters()).dtype
    with torch.device("meta"):
        small = type(lm)(config).to(dtype).eval()
    if [(k, tuple(p.shape), p.dtype) for k, p in small.named_parameters() if ".layers." not in k] != \
            [(k, tuple(p.shape), p.dtype) for k, p in lm.named_parameters() if ".layers." not in k]:
        return None
    wrapper = type(module)(small)
    if kind == "prefill":
        return Twin(wrapper, tuple(inputs), shapes, lm.config.num_hidden_layers)
    cut = tuple(inputs[:1 + 2 * 2])
    if shapes is not None:
        shapes = (shapes[0], tuple(shapes[1])[:2 * 2])
    return Twin(wrapper, cut, shapes, lm.config.num_hidden_layers)


_LAYER = re.compile(r"layers\.(\d+)(?:\.|$)")


def layer_of(node) -> int | None:
    """The decoder layer a node was traced in (its innermost ``layers.<i>`` module), or None."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, _type in reversed(list(stack.values())):
        m = _LAYER.search(str(path))
        if m:
            return int(m.group(1))
    return None


def _renumber(text: str, i: int) -> str:
    """``...layers_1_...``/``...layers.1....`` -> layer ``i``."""
    text = re.sub(rf"layers_{TEMPLATE}_", f"layers_{i}_", text)
    return re.sub(rf"layers\.{TEMPLATE}(\.|$)", rf"layers.{i}\1", text)


@dataclass
class _Shape:
    template: list          # the template's nodes, graph order
    carry_in: object        # the node of layer 0 the template reads
    carry_out: object       # the template's node read after it
    params: list            # placeholders only the template reads (its weights)
    inputs: list            # user-input placeholders only the template reads (its cache)
    kv_out: list            # template nodes in the graph's output, output order


def _satellites(graph, inside: set) -> set:
    """``inside`` with the unattributed nodes only it reads (a cache layer's copy of its past
    keys, made before the layers run): they belong to that layer's copy."""
    changed = True
    while changed:
        changed = False
        for n in graph.nodes:
            if n.op == "call_function" and n not in inside and layer_of(n) is None and n.users and \
                    all(u in inside for u in n.users):
                inside.add(n)
                changed = True
    return inside


def _size_of(node) -> bool:
    """A read of a tensor's size (symbolic captures read the context length from one layer's
    cache: every layer's cache has it, so the copies need not share that layer's tensor)."""
    import torch

    return node.op == "call_function" and node.target is torch.ops.aten.sym_size.int


def _shape(captured) -> _Shape | None:
    """The template layer's boundary in ``captured``, or None where the graph is not a stack
    of identical layers (module docstring)."""
    graph = captured.graph_module.graph
    kinds = {name: kind for name, kind, _t in captured.placeholders}
    if any(layer_of(n) not in (None, 0, TEMPLATE) for n in graph.nodes):
        return None
    position = {n: i for i, n in enumerate(graph.nodes)}
    inside = _satellites(graph, {n for n in graph.nodes if n.op == "call_function" and layer_of(n) == TEMPLATE})
    template = sorted(inside, key=position.__getitem__)
    if not template:
        return None
    layer0 = {n for n in graph.nodes if n.op == "call_function" and layer_of(n) == 0}
    reads = {a for n in template for a in n.all_input_nodes if a not in inside}
    carry_in = [a for a in reads if a in layer0]
    own = sorted((a for a in reads if a.op == "placeholder" and all(u in inside or _size_of(u) for u in a.users)),
                 key=position.__getitem__)
    shared = reads - set(carry_in) - set(own)
    if any(not any(u in layer0 for u in a.users) for a in shared):
        return None        # a value read by the template alone, computed outside it: not a copyable layer
    output = next(n for n in graph.nodes if n.op == "output")
    read_after = {n for n in template for u in n.users if u not in inside and u is not output}
    if len(carry_in) != 1 or len(read_after) != 1:
        return None
    params = [p for p in own if kinds.get(p.name) != "input"]
    if any(_renumber(p.name, 7) == p.name for p in params):
        return None        # a template-only value that is not named by its layer
    flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    return _Shape(template, carry_in[0], read_after.pop(), params,
                  [p for p in own if kinds.get(p.name) == "input"], [a for a in flat if a in inside])


def _new_placeholder(graph, after, name):
    with graph.inserting_after(after):
        return graph.placeholder(name)


def _input_name(name: str, i: int, per_layer: int) -> str:
    m = re.match(r"(.*?)(\d+)$", name)
    return f"{m.group(1)}{int(m.group(2)) + (i - TEMPLATE) * per_layer}" if m else f"{name}_{i}"


def _copy_layer(graph, shape: _Shape, i: int, carry, cursor, places: dict):
    """Layer ``i`` as a copy of the template after ``cursor``, reading ``carry``; returns
    (its carry out, its cache outputs, the last node inserted)."""
    env = {shape.carry_in: carry}
    for p in shape.params + shape.inputs:
        env[p] = places[(p, i)]
    for n in shape.template:
        with graph.inserting_after(cursor):
            new = graph.node_copy(n, lambda a: env.get(a, a))
        stack = n.meta.get("nn_module_stack")
        if stack:
            new.meta["nn_module_stack"] = {_renumber(k, i): (_renumber(str(path), i), t)
                                           for k, (path, t) in stack.items()}
        env[n] = cursor = new
    return env[shape.carry_out], [env[k] for k in shape.kv_out], cursor


def expand(captured, layers: int):
    """``captured`` (a two-layer twin's graph) with layers 2..``layers``-1 added as copies of
    layer 1, in place; returns it, or None (graph untouched) where its shape does not allow
    (module docstring)."""
    shape = _shape(captured)
    if shape is None:
        return None
    gm = captured.graph_module
    graph = gm.graph
    output = next(n for n in graph.nodes if n.op == "output")
    tail_users = [u for u in shape.carry_out.users if u not in set(shape.template)]
    kinds = {name: (kind, target) for name, kind, target in captured.placeholders}
    places: dict = {}
    new_params, new_inputs = [], []
    last_param = max(shape.params, key=lambda p: list(graph.nodes).index(p)) if shape.params else None
    last_place = [n for n in graph.nodes if n.op == "placeholder"][-1]
    cursor_p = last_param
    for i in range(TEMPLATE + 1, layers):
        for p in shape.params:
            cursor_p = places[(p, i)] = _new_placeholder(graph, cursor_p, _renumber(p.name, i))
            places[(p, i)].meta = copy.copy(p.meta)
            new_params.append((places[(p, i)].name, kinds[p.name][0], _renumber(str(kinds[p.name][1]), i), p.name))
    for i in range(TEMPLATE + 1, layers):
        for p in shape.inputs:
            last_place = places[(p, i)] = _new_placeholder(graph, last_place, _input_name(p.name, i, len(shape.inputs)))
            places[(p, i)].meta = copy.copy(p.meta)
            new_inputs.append(places[(p, i)].name)
    carry, cursor, kv = shape.carry_out, shape.template[-1], []
    for i in range(TEMPLATE + 1, layers):
        carry, outs, cursor = _copy_layer(graph, shape, i, carry, cursor, places)
        kv += outs
    for u in tail_users:
        u.replace_input_with(shape.carry_out, carry)
    flat = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    at = max(flat.index(k) for k in shape.kv_out) + 1 if shape.kv_out else len(flat)
    flat[at:at] = kv
    output.args = (tuple(flat),)
    graph.lint()
    gm.recompile()
    _update(captured, new_params, new_inputs, flat)
    return captured


def _update(captured, new_params, new_inputs, flat) -> None:
    """The Captured's placeholder list (graph order), tensors and output names after expand."""
    info = {name: (kind, target) for name, kind, target in captured.placeholders}
    for name, kind, target, source in new_params:
        info[name] = (kind, target)
        captured.tensors[name] = captured.tensors[source]
    users = sum(1 for kind, _t in info.values() if kind == "input")
    for j, name in enumerate(new_inputs):
        info[name] = ("input", users + j)
    order = [n.name for n in captured.graph_module.graph.nodes if n.op == "placeholder"]
    captured.placeholders = [(name, *info[name]) for name in order]
    captured.outputs = [getattr(a, "name", None) for a in flat]
