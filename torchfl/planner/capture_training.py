"""Training graphs: what AOTAutograd hands a backend, as the planner's Captured.

The forward and backward graphs of a training step come from AOTAutograd with core-ATen
decompositions minus what a rule pack maps whole (:func:`training_decompositions`), with
attention traced as math (:func:`attention_as_math`); :func:`captured_aot` makes either
graph a :class:`~torchfl.planner.capture.Captured` (its tensor constants lifted).
"""
from __future__ import annotations

from typing import Any

from torchfl.planner.capture import Captured, CaptureError, is_static


def training_decompositions(packs) -> dict:
    """Core-ATen decompositions, except the ops a rule of ``packs`` maps whole
    (``native_layer_norm_backward``, ``native_batch_norm_backward``, ``gelu_backward``,
    ``convolution_backward``, ...): decomposed, they would become primitive ops that no
    kernel serves (exp, erf, comparisons), i.e. CPU fallbacks. A ``convolution_backward``
    that needs the input and the weight gradients is split in two calls, one per kernel."""
    import torch
    from torch._decomp import core_aten_decompositions

    from torchfl.planner.capture import extra_decompositions

    whole = {r.op for pack in packs for r in pack.rules}
    table = {op: fn for op, fn in core_aten_decompositions().items() if str(op) not in whole}
    table.update(extra_decompositions(whole))
    conv_bwd = torch.ops.aten.convolution_backward.default
    if {"conv2d_backward_input", "conv2d_backward_weight"} <= {r.kernel for pack in packs for r in pack.rules
                                                               if r.op == str(conv_bwd)}:
        table[conv_bwd] = _split_convolution_backward
    wn_bwd = torch.ops.aten._weight_norm_interface_backward.default
    if str(wn_bwd) not in whole:
        table[wn_bwd] = _weight_norm_backward
    return table


def attention_as_math():
    """Trace attention as torch's math implementation (matmuls, softmax), for AOTAutograd.

    Kept whole, attention on the CPU is traced as the flash kernel, whose core decomposition
    hands its backward the probabilities where the log-sum-exp belongs (torch 2.13: q/k/v
    gradients 10-100x off, silently); and no pack has an attention backward kernel. The math
    path is differentiated op by op, every part (and its backward) a chip kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


def _split_convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                transposed, output_padding, groups, output_mask):
    """``convolution_backward`` of a 1-D convolution as the 2-D one with H = 1 (the backward
    kernels are 2-D), then, asked for the input gradient *and* the weight (or bias) gradient, as two calls: the input gradient alone, then the weight and bias gradients.
    Each is one kernel's work (``conv2d_backward_input``, ``conv2d_backward_weight``), so
    both run on the chip; as one node no single kernel computes every output it returns.
    Any other call is left whole (``NotImplemented``: traced as it is)."""
    import torch

    op = torch.ops.aten.convolution_backward.default
    if input.dim() == 3 and weight.dim() == 3 and not transposed:    # 1-D: as 2-D with H = 1
        lift = lambda v, first: [first, *v] if len(v) == 1 else list(v)
        g4, i4, w4 = grad_output.unsqueeze(2), input.unsqueeze(2), weight.unsqueeze(2)
        gi, gw, gb = op(g4, i4, w4, bias_sizes, lift(stride, 1), lift(padding, 0), lift(dilation, 1), transposed,
                        lift(output_padding, 0), groups, output_mask)
        return (gi.squeeze(2) if gi is not None else None, gw.squeeze(2) if gw is not None else None, gb)
    if not (output_mask[0] and (output_mask[1] or output_mask[2])):
        return NotImplemented
    args = (bias_sizes, stride, padding, dilation, transposed, output_padding, groups)
    grad_input = op(grad_output, input, weight, *args, [True, False, False])[0]
    _gi, grad_weight, grad_bias = op(grad_output, input, weight, *args, [False, output_mask[1], output_mask[2]])
    return grad_input, grad_weight, grad_bias


def _weight_norm_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """The gradients of ``w = g * v / ||v||`` (``_weight_norm_interface``; norms over every dim but
    ``dim``, kept) as elementwise ops and sums, the formula of ATen's ``weight_norm_backward``:
    grad_g = sum(grad_w * v) / norm, grad_v = (g / norm) * (grad_w - v * grad_g / norm)."""
    dims = [d for d in range(saved_v.dim()) if d != dim % max(saved_v.dim(), 1)]
    grad_g = (grad_w * saved_v).sum(dims, keepdim=True) / saved_norms
    grad_v = (saved_g / saved_norms) * (grad_w - saved_v * (grad_g / saved_norms))
    return grad_v, grad_g


def capture_training(module, example_inputs, packs=None) -> tuple[Captured, Captured]:
    """Forward and backward graphs from AOTAutograd (core-ATen decompositions, minus the
    ops ``packs`` map whole: :func:`training_decompositions`; all of core ATen without packs).

    Runs one forward and backward of ``module`` (gradients of the sum of the outputs) to
    make AOTAutograd compile both graphs. Placeholders of these graphs are all ``input``s
    (AOTAutograd passes parameters as primals); the forward's ``extra["weights"]`` are the
    positions of its parameter primals (the runtime caches those on the device).
    """
    import torch
    from torch._dynamo.backends.common import aot_autograd

    graphs: dict[str, Any] = {}

    def grab(kind):
        def compiler(gm, inputs):
            graphs[kind] = (gm, list(inputs))
            return gm.forward

        return compiler

    aot = aot_autograd(fw_compiler=grab("forward"), bw_compiler=grab("backward"),
                       decompositions=training_decompositions(packs or ()))
    weights: list = []

    def backend(gm, inputs):
        # the forward's primals are Dynamo's graph inputs, in order: its parameters are the weights
        weights.extend(i for i, a in enumerate(inputs) if is_static(a))
        with attention_as_math():
            return aot(gm, inputs)

    torch._dynamo.reset()
    compiled = torch.compile(module, backend=backend, fullgraph=True)
    out = compiled(*example_inputs)
    # any output structure (tuples, dicts, Hugging Face ModelOutput): its differentiable tensors
    grads = [o for o in torch.utils._pytree.tree_leaves(dict(out) if hasattr(out, "keys") else out)
             if isinstance(o, torch.Tensor) and o.requires_grad]
    if not grads:
        raise CaptureError("the model's outputs carry no gradient (no output depends on a trainable parameter): "
                           "put the module in train mode with requires_grad parameters, or plan it for inference")
    sum(o.float().sum() for o in grads).backward()
    if "forward" not in graphs or "backward" not in graphs:
        raise CaptureError("AOTAutograd produced no backward graph: does the model have trainable parameters?")
    return (captured_aot(graphs["forward"][0], "forward", weights),
            captured_aot(graphs["backward"][0], "backward"))


def captured_aot(gm, kind: str, weights=()) -> Captured:
    """The planner's Captured for an AOTAutograd graph (``kind`` forward or backward; all
    placeholders are inputs).

    Parameters change at every optimiser step, so they stay inputs (never cached), but
    they carry no batch dimension: the forward's weight primals (``weights``: positions of
    the Dynamo graph's parameters, the same as the forward's) and every backward input
    are exempt from the batch limit (``extra["unbatched"]``). Tensor constants the graph reads
    with ``get_attr`` (a ``torch.tensor(...)`` made in forward) become its constants
    (:func:`_constants_as_placeholders`), as torch.export lifts them on the inference path."""
    placeholders = [(n.name, "input", i) for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")]
    gm, constants = _constants_as_placeholders(gm)
    placeholders += [(name, "constant", target) for name, target, _t in constants]
    if kind == "backward":
        unbatched = [name for name, _k, _i in placeholders]
    else:
        unbatched = [placeholders[i][0] for i in weights if i < len(placeholders)]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    flat = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    outputs = [getattr(a, "name", None) for a in flat]
    return Captured(gm, placeholders, {name: t for name, _target, t in constants}, outputs, training=True,
                    extra={"graph": kind, "unbatched": unbatched,
                           "weights": tuple(weights) if kind == "forward" else ()})


def _constants_as_placeholders(gm):
    """(graph module, [(name, attribute, tensor)]): ``gm`` with each ``get_attr`` of a tensor
    turned into a placeholder of the same name (a copy; ``gm`` itself is left as it is), so the
    planner sees what the exported path's lifted constants are: static inputs, uploaded once.
    AOTAutograd keeps a forward's ``torch.tensor(...)`` this way (``_tensor_constant0``)."""
    import copy

    import torch

    def tensor_of(node):
        obj = gm
        for part in str(node.target).split("."):
            obj = getattr(obj, part, None)
        return obj if isinstance(obj, torch.Tensor) else None

    tensors = {n.name: (str(n.target), t) for n in gm.graph.nodes
               if n.op == "get_attr" and (t := tensor_of(n)) is not None}
    if not tensors:
        return gm, []
    gm = copy.deepcopy(gm)
    graph, constants = gm.graph, []
    first = next(n for n in graph.nodes if n.op != "placeholder")
    for node in [n for n in graph.nodes if n.op == "get_attr" and n.name in tensors]:
        target, tensor = tensors[node.name]
        with graph.inserting_before(first):
            ph = graph.placeholder(f"{node.name}_lifted")
        ph.meta = dict(node.meta)
        ph.meta.setdefault("val", torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                                                      device="meta"))
        node.replace_all_uses_with(ph)
        graph.erase_node(node)
        constants.append((ph.name, target, tensor.detach()))
    gm.recompile()
    return gm, constants


def concrete(gm, args):
    """An AOT graph traced with symbolic shapes, re-traced on the concrete ``args`` (a plan
    is made for one shape)."""
    import torch

    symbolic = False
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in v.shape)):
            symbolic = True
            break
    if not symbolic:
        return gm
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        return make_fx(gm, tracing_mode="real")(*args)
