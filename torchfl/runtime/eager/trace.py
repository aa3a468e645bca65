"""One op (or lazy mode's recorded ops) as the core-ATen FX graph the planner takes: the
decomposition table of a device's rule packs, the spellings the fusion rules match, the
writes an op makes without saying so, and the examples the planner sees.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_unflatten

from .calls import distinct_positions, in_optimizer_step, is_random_op

__all__ = ["TRACE_AS", "TRACE_ON_META", "KEPT_WHOLE", "python_dispatch_enabled", "trace_op", "transposed_operands", "functionalize_input_writes",
           "drop_dead", "decompositions", "unbatched_inputs", "planning_examples", "is_random_graph",
           "eval_batch_norm"]


def _native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """``native_batch_norm`` as the compile path captures it: in inference
    ``_native_batch_norm_legit_no_training`` (the fusion rules' spelling). In training it
    writes its running statistics although its schema does not say so: trace it as the
    functional form the rules map (which returns the new statistics) plus the writes (``functionalize_input_writes`` turns them into
    outputs copied back after the run)."""
    aten = torch.ops.aten
    if running_mean is None or running_var is None:
        return aten.native_batch_norm.default(input, weight, bias, running_mean, running_var, training,
                                              momentum, eps)
    if not training:    # the spelling torch.export gives, which the fusion rules match
        return aten._native_batch_norm_legit_no_training.default(input, weight, bias, running_mean,
                                                                 running_var, momentum, eps)
    out, mean, invstd, new_mean, new_var = aten._native_batch_norm_legit_functional.default(
        input, weight, bias, running_mean, running_var, True, momentum, eps)
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)
    return out, mean, invstd


TRACE_AS = {torch.ops.aten.native_batch_norm.default: _native_batch_norm}


#: ops whose meta kernel refuses, on CPU tensors alone, dtypes their kernel takes: histc of
#: integers (CPU's "histogram_cpu" has no integer kernel; CUDA's counts them, and transformers'
#: MoE routing passes int32 expert ids on every device but CPU). Traced over meta-device examples,
#: where that check does not apply; the graph is the same op, and the histc kernel counts integers.
TRACE_ON_META = frozenset({torch.ops.aten.histc.default})


# composite ops the adapter routes whole (routing.install) and the rules map as they are
KEPT_WHOLE = frozenset({torch.ops.aten.scaled_dot_product_attention.default})


def python_dispatch_enabled():
    """Tracing (make_fx's fake tensors) needs the Python dispatch keys, which torch turns
    off inside some of its own constructions: ``torch.tensor([], device="npu")`` copies to
    the device under ``no_dispatch()``, and that copy is a lazy-mode sync point."""
    import contextlib

    keys = torch._C.DispatchKey
    stack = contextlib.ExitStack()
    for key in (keys.Python, keys.PythonTLSSnapshot):
        stack.enter_context(torch._C._SetExcludeDispatchKeyGuard(key, False))
    return stack


def transposed_operands(op, flat, spec, tensors, alias=None) -> tuple:
    """``(position,)`` of an ``mm`` / ``addmm`` whose matrix operand is the transpose of a
    row-major tensor (``w.t()``: a linear layer's weight as ``F.linear`` hands it to
    ``addmm``; a parameter's view), with a bias of shape [N] and alpha = beta = 1; else ``()``. Planned as it is,
    that operand is copied into row-major order on every call (a converted input) and the GEMM
    packs it again (ResNet-50's classifier: 9 ms of a 170 ms forward); traced as
    ``linear(x, w, bias)`` over the weight's own storage, the planner maps it as the compile
    path does (torch.export keeps ``linear``): the weight is read as stored (one row of A: the
    GEMV path streams it once)."""
    aten = torch.ops.aten
    if alias is not None or op not in (aten.addmm.default, aten.mm.default):
        return ()
    a, k = tree_unflatten(flat, spec)
    pos = 2 if op is aten.addmm.default else 1
    if len(tensors) != pos + 1 or any(not isinstance(x, torch.Tensor) for x in a[:pos + 1]) or len(a) > pos + 1:
        return ()
    if op is aten.addmm.default:
        if set(k) - {"beta", "alpha"} or any(type(k[n]) not in (int, float) or k[n] != 1 for n in k):
            return ()
        if tensors[0].shape != (tensors[2].shape[1],):
            return ()
    elif k:
        return ()
    w, x = tensors[pos], tensors[pos - 1]
    if x.dim() != 2 or w.dim() != 2 or min(w.shape) < 2 or w.stride() != (1, w.shape[0]) \
            or not isinstance(w._base, torch.nn.Parameter):      # a weight (batch limits never apply)
        return ()
    return (pos,)


def _as_linear(op):
    """``addmm(bias, x, wT)`` / ``mm(x, wT)`` called with ``w`` (row-major) as ``linear``."""
    if op is torch.ops.aten.addmm.default:
        return lambda bias, x, w, **_: torch.ops.aten.linear.default(x, w, bias)
    return lambda x, w: torch.ops.aten.linear.default(x, w)


def trace_op(op, flat, spec, tensors, table, alias=None, first_only=False, transposed=()):
    """The op alone as a core-ATen FX graph over its (distinct) tensor arguments
    (``first_only``: returning its first output alone). ``transposed``: positions whose
    placeholder is the tensor's transpose (row-major) and the op is traced as ``linear``
    (:func:`transposed_operands`; the caller passes ``t.t()`` for them)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    is_tensor = [isinstance(a, torch.Tensor) for a in flat]
    call = _as_linear(op) if transposed else TRACE_AS.get(op, op)
    if alias is not None:
        keep = distinct_positions(alias)
        slot = {p: i for i, p in enumerate(keep)}
        tensors = [tensors[p] for p in keep]

    def one_op(*ts):
        if alias is not None:
            ts = [ts[slot[first]] for first in alias]
        it = iter(ts)
        vals = [next(it) if t else a for a, t in zip(flat, is_tensor)]
        a, k = tree_unflatten(vals, spec)
        out = call(*a, **k)
        return out[0] if first_only else out

    dev = "meta" if op in TRACE_ON_META else "cpu"
    examples = [torch.empty_strided(tuple(t.shape[::-1]), tuple(t.stride()[::-1]), dtype=t.dtype, device=dev)
                if i in transposed else torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=dev)
                for i, t in enumerate(tensors)]
    with torch.no_grad(), python_dispatch_enabled():
        if op in KEPT_WHOLE or transposed:     # a composite the rules map whole: pre-dispatch keeps it one node
            gm = make_fx(one_op, tracing_mode="fake", pre_dispatch=True)(*examples)
        else:
            gm = make_fx(one_op, decomposition_table=table, tracing_mode="fake")(*examples)
    drop_dead(gm)
    return gm


def functionalize_input_writes(gm) -> list:
    """Ops that write their inputs without saying so in their schema (a training-mode
    ``native_batch_norm`` updates its running statistics) trace as ``copy_`` into a
    placeholder. Each such write becomes an extra graph output, appended after the
    original output (which becomes element 0 of a tuple); returns the written
    placeholders' positions, in the order of the extra outputs."""
    aten = torch.ops.aten
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    writes = []
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.copy_.default and node.args[0] in placeholders:
            dst, src = node.args[0], node.args[1]
            node.replace_all_uses_with(src)
            gm.graph.erase_node(node)
            writes.append((placeholders.index(dst), src))
    if writes:
        out = next(n for n in gm.graph.nodes if n.op == "output")
        out.args = ((out.args[0],) + tuple(src for _i, src in writes),)
        gm.recompile()
    return [i for i, _src in writes]


def drop_dead(gm) -> None:
    """Remove the unread ``getitem`` nodes make_fx leaves behind (the planner folds a
    multi-output node's getitems into it and expects each to be read)."""
    if gm.graph.eliminate_dead_code():
        gm.recompile()


def decompositions(dev) -> dict:
    """The one-op decomposition table of device ``dev``'s rule packs (an
    :class:`~torchfl.runtime.eager.device.NpuDevice`; made once per device)."""
    table = dev.decompositions
    if table is None:
        table = dev.decompositions = _decompositions(dev.target.packs)
    return table


def _decompositions(packs) -> dict:
    """Core ATen, except what a rule maps whole (the compile path's training table) and
    the ops the inference capture keeps (linear, conv2d, attention...)."""
    from torchfl.planner.capture import KEEP_OPS
    from torchfl.planner.capture_training import training_decompositions

    keep = {f"aten.{name}" for name in KEEP_OPS}
    return {op: fn for op, fn in training_decompositions(packs).items() if str(op) not in keep}


#: ops whose first operand is a table rows are looked up in: its rows are no batch, the
#: indices carry it (GPT-J's sin/cos buffer of 2048 positions, read by ``table[position_ids]``)
LOOKUPS = frozenset({"aten.index.Tensor", "aten._unsafe_index.Tensor", "aten.embedding.default",
                     "aten.index_select.default"})


def lookup_tables(gm) -> set:
    """Names of ``gm``'s placeholders read only as the table of a lookup (:data:`LOOKUPS`)."""
    out = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder" and n.users and all(
                u.op == "call_function" and str(u.target) in LOOKUPS and u.args[0] is n
                and n not in u.args[1:] for u in n.users):
            out.add(n.name)
    return out


def unbatched_inputs(placeholders, tensors, gm=None) -> list:
    """Placeholders exempt from ``max_batch_size``, as the compile path exempts its lifted
    weights and every input of a backward graph: parameters (and views of them: ``w.t()``
    of a linear layer), vectors (biases, a batch-norm's running statistics: an eager op
    cannot tell a module's buffer from an activation, and a batch is never 1-D here),
    tables a lookup reads (``max_batch_size`` is the model's batch, which the indices carry;
    with ``gm``, the traced graph) and, inside the autograd engine, every input of a backward op."""
    if torch._C._current_autograd_node() is not None or in_optimizer_step():
        return [name for name, _k, _i in placeholders]
    tables = lookup_tables(gm) if gm is not None else set()
    return [name for (name, _k, _i), t in zip(placeholders, tensors)
            if t.dim() <= 1 or isinstance(t, torch.nn.Parameter) or name in tables
            or isinstance(getattr(t, "_base", None), torch.nn.Parameter)]


def planning_examples(tensors, hcd) -> list:
    """The tensors as the planner should see them. A view is storage strides, not a chip
    layout: a tensor stored in a permutation the chip does not compute in (attention's
    heads moved, ``NWCH``) is planned as a row-major input, and the executor converts it on
    upload (a counted conversion, ``STATS["converted_inputs"]``) instead of the planner
    refusing the layout."""
    from torchfl.planner.constraints import tensor_layout

    layouts = hcd.layouts
    out = []
    for t in tensors:
        lay = tensor_layout(t) if t.dim() == 4 else None
        if lay is not None and lay not in layouts:
            t = torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
        out.append(t)
    return out


def is_random_graph(gm) -> bool:
    """Whether a traced graph draws random numbers (dropout's ``rand``/``bernoulli``, sdpa
    with dropout...): such graphs run with the device's generator in place."""
    return any(n.op == "call_function" and is_random_op(n.target) for n in gm.graph.nodes)


def eval_batch_norm(op, flat, spec) -> bool:
    """Whether the call is an inference-mode ``native_batch_norm``, whose saved mean and
    inverse std torch returns empty (shape (0,), the input's dtype: nothing is saved). Its
    route plans the normalised output alone and hands two empty tensors beside it, as the
    CPU does: no cast steps for those empty values, so the op takes the direct path
    (ResNet-50 b1 has 53 batch-norms, each planned with two cast steps and run through the
    executor's general path because of them)."""
    if op is not torch.ops.aten.native_batch_norm.default:
        return False
    a, k = tree_unflatten(flat, spec)
    return (a[5] if len(a) > 5 else k.get("training")) is False


