"""Graph capture: module (or Dynamo graph) + example inputs -> core-ATen FX graph with meta.

The recipe (measured in FINDINGS): ``torch.export.export`` then ``run_decompositions`` with
the default table minus the ops that chip kernels serve whole (attention, linear,
layer_norm, conv2d/convolution, gelu). Batch-norm arrives as
``_native_batch_norm_legit_no_training``. Parameters and buffers are lifted to
placeholders; their tensors are returned by placeholder name so the runtime can bind them.
For training, AOTAutograd gives forward and backward graphs (there attention is already
decomposed into bmm/_softmax and linear into addmm/mm; the candidates recognise those).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

KEEP_OPS = (
    "scaled_dot_product_attention.default",
    "linear.default",
    "layer_norm.default",
    "conv2d.default",
    "convolution.default",
    "gelu.default",
)

#: ops outside core ATen's decomposed set that no rule maps, whose torch decomposition runs on
#: kernels the packs have: bilinear resize (MobileViT's F.interpolate: gathers of the four
#: neighbours and weighted sums; fell back whole in both modes, issue 48 held-out zoo)
DECOMPOSED_TOO = ("upsample_bilinear2d.vec", "upsample_bilinear2d.default")


def extra_decompositions(whole=frozenset()) -> dict:
    """torch's decompositions of :data:`DECOMPOSED_TOO`, but those a rule maps whole (``whole``:
    ``aten.<op>.<overload>`` names)."""
    import torch
    from torch._decomp import get_decompositions

    ops = [getattr(getattr(torch.ops.aten, n.split(".")[0]), n.split(".")[1]) for n in DECOMPOSED_TOO
           if f"aten.{n}" not in whole]
    return get_decompositions(ops)


class CaptureError(RuntimeError):
    """The model could not be captured as one graph (message says why and what to try)."""


@dataclass
class Captured:
    """A captured graph: the FX module, its placeholders and the tensors of the lifted ones.

    ``placeholders`` are ``(name, kind, target)`` in graph order, ``kind`` in
    input/parameter/buffer/constant; ``outputs`` the names of the output node's values
    (``None`` for a non-tensor output).
    """

    graph_module: Any
    placeholders: list[tuple[str, str, Any]]
    tensors: dict[str, Any]
    outputs: list[str | None]
    training: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def decomposition_table():
    import torch

    table = torch.export.default_decompositions()
    table.update(extra_decompositions())
    for name in KEEP_OPS:
        packet, overload = name.split(".")
        table.pop(getattr(getattr(torch.ops.aten, packet), overload), None)
    return table


def _from_exported(ep, training: bool = False) -> Captured:
    from torch.export.graph_signature import InputKind

    sig = ep.graph_signature
    kinds = {}
    user_index = 0
    state = dict(ep.state_dict)
    constants = dict(getattr(ep, "constants", {}) or {})
    tensors: dict[str, Any] = {}
    placeholders = []
    for spec in sig.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            placeholders.append((name, "input", user_index))
            user_index += 1
            continue
        kind = {InputKind.PARAMETER: "parameter", InputKind.BUFFER: "buffer"}.get(spec.kind, "constant")
        target = spec.target
        value = state.get(target, constants.get(target))
        if value is None:
            raise CaptureError(f"placeholder {name} ({kind} {target!r}) has no tensor in the exported program")
        tensors[name] = value
        placeholders.append((name, kind, target))
        kinds[name] = kind
    outputs = [getattr(spec.arg, "name", None) for spec in sig.output_specs]
    return Captured(ep.graph_module, placeholders, tensors, outputs, training)


def _without_effect_tokens(ep):
    """Side-effecting ops (``linalg.inv``'s ``_linalg_check_errors``) arrive wrapped in
    ``with_effects`` with an effect-token placeholder and output; torch's own pass turns them
    back into plain calls, so the token never reaches the planner as a tensor-less input."""
    from torch.export.graph_signature import InputKind

    if not any(s.kind == InputKind.TOKEN for s in ep.graph_signature.input_specs):
        return ep
    from torch.export._remove_effect_tokens_pass import _remove_effect_tokens

    return _remove_effect_tokens(ep)


def capture_module(module, example_inputs) -> Captured:
    """Inference capture of ``module(*example_inputs)`` through torch.export."""
    module, example_inputs = _with_cache_outputs(module, tuple(example_inputs))
    try:
        captured, _ep = export_captured(module, example_inputs)
    except Exception as exc:  # noqa: BLE001 - torch.export raises a dozen types of its own: one CaptureError, raised
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CaptureError(
            f"torch.export could not capture {type(module).__name__}: {first} "
            "(the model must trace as one graph; remove data-dependent Python control flow "
            "or return only tensors)") from exc
    renamed = drop_unread_pool_indices(captured.graph_module)
    captured.outputs = [renamed.get(name, name) for name in captured.outputs]
    drop_same_device(captured.graph_module)
    return captured


def export_captured(module, inputs, shapes=None):
    """(Captured, ExportedProgram) of ``module(*inputs)`` (``shapes``: export's dynamic_shapes),
    decomposed; a deep meta-device decoder through its two-layer twin (``planner.repeat``)."""
    from torchfl.planner.repeat import expand, twin_of

    twin = twin_of(module, inputs, shapes)
    if twin is not None:
        captured, ep = _export(twin.module, twin.inputs, twin.shapes)
        if expand(captured, twin.layers) is not None:
            return captured, ep
    return _export(module, inputs, shapes)


def _export(module, inputs, shapes):
    import torch

    from torchfl.kernels.ssm.hf_route import capturing

    module, inputs = meta_as_fake(module, tuple(inputs))
    with warnings.catch_warnings(), capturing():     # transformers' Mamba scan as the selective_scan kernel
        # torch 2.13's run_decompositions deep-copies its own LeafSpec and warns about it
        # on every capture: torch's internals, nothing a user can act on
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        ep = torch.export.export(module, tuple(inputs), dynamic_shapes=None if shapes is None else tuple(shapes),
                                 strict=False)
        ep = _without_effect_tokens(ep.run_decompositions(decomposition_table()))
    return _from_exported(ep), ep


def meta_as_fake(module, example_inputs):
    """A model built on the meta device, traced as the host would trace it, still without
    weights: a copy whose parameters and inputs are fake CPU tensors (shapes, no storage).

    Meta kernels are not the CPU's: ``scaled_dot_product_attention`` on meta returns row-major
    strides where the CPU kernel returns the head-transposed ones, so ``.transpose().contiguous()``
    became an extra copy, and the plan differed from the same model's with real weights."""
    import copy

    import torch

    on_meta = any(p.is_meta for p in module.parameters()) or any(
        isinstance(x, torch.Tensor) and x.is_meta for x in example_inputs)
    if not on_meta or not isinstance(module, torch.nn.Module):
        return module, example_inputs
    from torch._subclasses.fake_tensor import FakeTensorMode

    module = copy.deepcopy(module)     # the caller's model stays on meta (no storage: cheap)
    with FakeTensorMode(allow_non_fake_inputs=True):
        module = module.to_empty(device="cpu")
        example_inputs = tuple(torch.empty(x.shape, dtype=x.dtype) if isinstance(x, torch.Tensor) else x
                               for x in example_inputs)
    return module, example_inputs


def _with_cache_outputs(module, example_inputs):
    """A Hugging Face causal LM with its default config (``use_cache=True``) returns a
    ``DynamicCache``, which torch.export refuses as an output: such a model is captured as its
    prefill (``planner.lm.Prefill``: the logits, then each layer's keys and values)."""
    if not type(module).__module__.startswith("transformers.") or len(example_inputs) != 1:
        return module, example_inputs
    from torchfl.planner.lm import Prefill, is_causal_lm

    if not (is_causal_lm(module) and getattr(module.config, "use_cache", False)):
        return module, example_inputs
    return Prefill(module), example_inputs


def drop_same_device(gm) -> int:
    """Remove the ``device`` of each ``_to_copy`` to the device its input is already on.

    ``x.to(y.device)`` (Hugging Face's rotary embedding, its masks) records the device it was
    traced on: ``cpu``, or ``meta`` for a model built on the meta device. Such a copy moves no
    data between devices; with the device named, no cast rule takes it (a device transfer is
    the runtime's) and it became a CPU fallback. Returns how many were rewritten."""
    import torch

    to_copy = torch.ops.aten._to_copy.default
    rewritten = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not to_copy or "device" not in node.kwargs:
            continue
        src = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if isinstance(src, torch.Tensor) and torch.device(node.kwargs["device"]) == src.device:
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "device"}
            rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def drop_unread_pool_indices(gm) -> dict[str, str]:
    """Rewrite each ``max_pool2d_with_indices`` whose indices nothing reads into ``max_pool2d``.

    Core ATen decomposes ``max_pool2d`` into the with-indices form even for inference, so a
    plan would compute, store and count int64 indices nobody reads (ResNet-50's stem pool:
    1.6 MB and the kernel's slower path). Training graphs keep the indices: the backward
    reads them. Returns the new name of each pooled value that was renamed."""
    import operator

    import torch

    aten = torch.ops.aten
    graph = gm.graph
    renamed: dict[str, str] = {}
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.max_pool2d_with_indices.default:
            continue
        users = list(node.users)
        if not all(u.op == "call_function" and u.target is operator.getitem for u in users):
            continue
        if any(u.args[1] != 0 and u.users for u in users):
            continue  # the indices are read
        with graph.inserting_before(node):
            pooled = graph.call_function(aten.max_pool2d.default, node.args, node.kwargs)
        pooled.meta = {k: (v[0] if k in ("val", "tensor_meta") and isinstance(v, (tuple, list)) else v)
                       for k, v in node.meta.items()}
        for u in users:
            if u.args[1] == 0:
                u.replace_all_uses_with(pooled)
                renamed[u.name] = pooled.name
            graph.erase_node(u)
        graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.lint()
        gm.recompile()
    return renamed


def capture_dynamo(gm, example_inputs) -> Captured:
    """Capture what a torch.compile backend receives (a Dynamo ``GraphModule``)."""
    return capture_module(specialise_scalars(gm, example_inputs), [x for x in example_inputs])


def _is_scalar_read(node) -> bool:
    import torch

    if node.op == "call_method":
        return node.target == "item"
    return node.op == "call_function" and node.target in (torch.ops.aten.item.default,
                                                          torch.ops.aten._local_scalar_dense.default)


def scalar_reads(gm) -> tuple[int, ...]:
    """Positions of the graph inputs it reads as Python numbers (``x.item()``).

    After a recompile Dynamo stops specialising a float attribute (GPT-2's attention
    ``scaling``) and passes it as a 0-d tensor read with ``item()``, which torch.export
    cannot trace. A plan is made for their values: callers key plans on them."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return tuple(i for i, p in enumerate(placeholders) if any(_is_scalar_read(u) for u in p.users))


def specialise_scalars(gm, example_inputs):
    """``gm`` with every ``x.item()`` of an input replaced by its value in ``example_inputs``
    (a copy; ``gm`` itself is left as it is). The input stays, unused."""
    import copy

    from torch.fx.node import map_arg

    positions = scalar_reads(gm)
    if not positions:
        return gm
    gm = copy.deepcopy(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in positions:
        value = example_inputs[i].item()
        for read in [u for u in placeholders[i].users if _is_scalar_read(u)]:
            for user in list(read.users):
                user.args = map_arg(user.args, lambda n, read=read: value if n is read else n)
                user.kwargs = map_arg(user.kwargs, lambda n, read=read: value if n is read else n)
            gm.graph.erase_node(read)
    gm.recompile()
    return gm


# ---------------------------------------------------------------- Dynamo's weights as graph inputs

def is_static(a) -> bool:
    """Is this graph input a weight (a parameter, or a buffer Dynamo marks static)?"""
    import torch

    return isinstance(a, torch.nn.Parameter) or bool(getattr(a, "_dynamo_static_input_type", None))


def lift_static(gm, args):
    """Dynamo passes parameters and buffers as graph inputs; give the planner a graph that
    holds them as parameters/buffers (``get_attr``), so they are planned as weights (static
    casts and layout transforms, no batch limits on an embedding table) and the plan keeps
    them. Returns (graph module, positions of the remaining user inputs)."""
    import copy

    import torch

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    static = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and is_static(a)]
    if len(placeholders) != len(args) or not static:
        return gm, tuple(range(len(args)))
    graph = copy.deepcopy(gm.graph)
    new_ph = [n for n in graph.nodes if n.op == "placeholder"]
    root = torch.nn.Module()
    for name, mod in gm.named_children():
        root.add_module(name, mod)
    for attr in {n.target for n in graph.nodes if n.op == "get_attr"}:
        obj = gm
        for part in str(attr).split("."):
            obj = getattr(obj, part)
        _set_attr(root, str(attr), obj)
    first = next(n for n in graph.nodes if n.op != "placeholder")
    used = set()
    taken = {n for n, _m in gm.named_children()} | {str(n.target).split(".")[0] for n in graph.nodes
                                                   if n.op == "get_attr"}
    for i in static:
        node = new_ph[i]
        target = _readable(node.name, i, used)
        if target.split(".")[0] in taken:     # never write into the user's own submodules
            target = f"torchfl_static_{i}"
        _set_attr(root, target, args[i])
        with graph.inserting_before(first):
            ga = graph.get_attr(target)
        ga.meta = dict(node.meta)
        node.replace_all_uses_with(ga)
        graph.erase_node(node)
    return torch.fx.GraphModule(root, graph), tuple(i for i in range(len(args)) if i not in set(static))


def _readable(placeholder: str, i: int, used: set) -> str:
    """Dynamo's ``l_self_modules_layer1_modules_0_modules_conv1_parameters_weight_`` ->
    ``layer1.0.conv1.weight`` (the state-dict key the user knows); unique."""
    import re

    name = re.sub(r"^l_(self|fn|args_\d+|kwargs)_", "", placeholder.lower()).strip("_")
    name = re.sub(r"(^|_)(modules|parameters|buffers)_", ".", name).strip(".")
    parts = [p for p in name.split(".") if p]
    if not parts or any(not re.fullmatch(r"[a-z_][a-z0-9_]*|\d+", p) for p in parts):
        parts = [f"static_{i}"]
    if parts[0].isdigit():
        parts = ["m"] + parts
    dotted = ".".join(parts)
    while dotted in used or any(u.startswith(dotted + ".") or dotted.startswith(u + ".") for u in used):
        dotted = f"{dotted}_{i}"
    used.add(dotted)
    return dotted


def _set_attr(root, dotted, value):
    import torch

    *path, last = dotted.split(".")
    obj = root
    for part in path:
        if not hasattr(obj, part):
            obj.add_module(part, torch.nn.Module())
        obj = getattr(obj, part)
    if isinstance(value, torch.nn.Module):
        obj.add_module(last, value)
    elif isinstance(value, torch.nn.Parameter):
        obj.register_parameter(last, value)
    elif isinstance(value, torch.Tensor):
        obj.register_buffer(last, value)
    else:
        setattr(obj, last, value)
