"""Rank lowering before planning (:func:`lower_rank`): views above rank 4 that only regroup
data rewritten to rank <= 4, and the graph-copy helpers it shares with ``decompose`` (which
runs it after folding ``repeat_kv``). Split out of ``decompose.py`` (issue 48: the stride-aware
merges made that module too long)."""
from __future__ import annotations

from torchfl.kernels.spec import numel as _prod

VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def copy_graph(graph):
    """A copy of ``graph`` and its nodes by name (a rewrite edits the copy, never the captured graph)."""
    import torch

    new = torch.fx.Graph()
    out = new.graph_copy(graph, {})
    new.output(out)
    return new, {n.name: n for n in new.nodes}


def with_graph(captured, graph, renamed):
    """``captured`` over ``graph``, its outputs renamed by ``renamed``."""
    import dataclasses

    import torch

    new_gm = torch.fx.GraphModule(captured.graph_module, graph)
    outputs = [renamed.get(o, o) if o is not None else None for o in captured.outputs]
    return dataclasses.replace(captured, graph_module=new_gm, outputs=outputs)


# ---------------------------------------------------------------- rank lowering

#: rank a rewrite brings views down to (the smallest max_rank of the bundled chips)
LOW_RANK = 4


def lower_rank(captured):
    """``captured`` with views of rank above ``LOW_RANK`` that only regroup data rewritten to
    rank <= ``LOW_RANK`` by merging the dimensions that move together, so a chip whose
    ``tensor.max_rank`` is 4 never holds them (and no chip moves more dimensions than it must):

    * ``view(x, S) -> permute(dims) [-> clone] -> view(T)`` (Swin's window partition,
      ``[B, H/w, w, W/w, w, C]``): dimensions adjacent and in order in ``dims`` merge;
    * ``view(x, S) -> select(d, i)`` for every reader (BLOOM's fused q/k/v, ``[B, L, H, 3, D]``):
      the dimensions before ``d`` merge, and those after;
    * ``unsqueeze -> expand -> clone -> view(T)`` (Swin's mask broadcast over windows): runs of
      dimensions that are not expanded merge.

    Every rewrite is exact (the same elements in the same order); a chain that would stay above
    ``LOW_RANK`` is left as it is, and the HCD's max_rank refuses it by name as before."""
    gm = captured.graph_module
    todo = [n for n in gm.graph.nodes if n.op == "call_function" and _rank(n) > LOW_RANK]
    if not todo:
        return captured
    graph, by_name = copy_graph(gm.graph)
    changed = False
    for name in [n.name for n in todo]:
        node = by_name.get(name)
        if node is None or not node.users:
            continue
        changed |= _lower_permute(graph, node) or _lower_select(graph, node) or _lower_expand(graph, node)
    if not changed:
        return captured
    graph.eliminate_dead_code()
    graph.lint()
    return with_graph(captured, graph, {})


def _rank(node) -> int:
    import torch

    v = node.meta.get("val")
    return v.dim() if isinstance(v, torch.Tensor) else 0


def _is(node, *names) -> bool:
    import torch

    return isinstance(node, torch.fx.Node) and node.op == "call_function" and str(node.target) in names


def _split_runs(val, groups) -> list:
    """``groups`` (lists of adjacent dims of ``val``, in order) split where ``val``'s strides do
    not let the dims merge into one view: a view merges dims ``j < k`` (size-1 dims between them
    skipped) only when ``stride[j] == stride[k] * size[k]``, so a slice or a transposed input
    keeps its dims apart, as eager's ``view`` would (GPT-J's rotary reads a split of its sin/cos
    table: merging its rows with the half it reads raised ``view size is not compatible``)."""
    shape, stride = tuple(val.shape), tuple(val.stride())
    out = []
    for g in groups:
        run, last = [g[0]], g[0] if shape[g[0]] != 1 else None
        for d in g[1:]:
            if shape[d] != 1 and last is not None and stride[last] != stride[d] * shape[d]:
                out.append(run)
                run = []
            run.append(d)
            if shape[d] != 1:
                last = d
        out.append(run)
    return out


def _viewable(node, shape) -> bool:
    """Whether ``view(node, shape)`` is one eager torch makes (checked on a meta tensor of
    ``node``'s sizes and strides): a rewrite that is not is skipped, never raised."""
    import torch

    val = node.meta["val"]
    try:
        torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device="meta").view(shape)
    except RuntimeError:
        return False
    return True


def _viewed(graph, node, shape, before, name):
    """``node`` where ``view(node, shape)`` is one eager torch makes, else a contiguous copy of
    it inserted before ``before`` (what ``reshape`` does): rank lowering keeps a chip of
    ``max_rank`` 4 running a chain whose input is a slice or a transpose (LLaMA's ``repeat_kv``
    of a transposed key in float32), at the price of one planned copy."""
    import torch

    if _viewable(node, shape):
        return node
    return _new(graph, torch.ops.aten.clone.default, [node], before, name,
                {"memory_format": torch.contiguous_format})


def _new(graph, op, args, before, name, kwargs=None):
    """A node ``op(*args, **kwargs)`` inserted before ``before``, its meta value from meta tensors."""
    import torch

    def meta(v):
        if isinstance(v, torch.fx.Node):
            val = v.meta["val"]
            return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device="meta")
        return v

    with graph.inserting_before(before):
        new = graph.create_node("call_function", op, tuple(args), dict(kwargs or {}), name=name)
    new.meta["val"] = op(*[meta(a) for a in args], **(kwargs or {}))
    return new


def _lower_permute(graph, view) -> bool:
    """view(x, S) -> permute(dims) [-> clone]* -> view(T), T of rank <= LOW_RANK."""
    import torch

    aten = torch.ops.aten
    if not _is(view, *VIEWS) or len(view.users) != 1:
        return False
    (perm,) = view.users
    if not _is(perm, "aten.permute.default"):
        return False
    chain, tail = [], perm
    while len(tail.users) == 1 and _is(next(iter(tail.users)), "aten.clone.default"):
        tail = next(iter(tail.users))
        chain.append(tail)
    if len(tail.users) != 1:
        return False
    (back,) = tail.users
    if not _is(back, *VIEWS) or _rank(back) > LOW_RANK or any(len(c.users) != 1 for c in chain):
        return False
    shape = tuple(view.meta["val"].shape)
    dims = [d % len(shape) for d in perm.args[1]]
    groups = [[dims[0]]]
    for d in dims[1:]:
        if d == groups[-1][-1] + 1:
            groups[-1].append(d)
        else:
            groups.append([d])
    if len(groups) > LOW_RANK:
        return False
    order = sorted(groups, key=lambda g: g[0])          # the groups in the input's order
    runs = _split_runs(view.meta["val"], order)         # without a copy where the strides allow
    if len(runs) <= LOW_RANK:
        order, groups = runs, sorted(runs, key=lambda g: dims.index(g[0]))
    merged = [_prod(shape[d] for d in g) for g in order]
    new_dims = [order.index(g) for g in groups]
    src = _viewed(graph, view.args[0], merged, back, f"{view.name}_c{len(merged)}")
    v2 = _new(graph, view.target, [src, merged], back, f"{view.name}_r{len(merged)}")
    cur = _new(graph, aten.permute.default, [v2, new_dims], back, f"{perm.name}_r{len(merged)}")
    for c in chain:
        cur = _new(graph, aten.clone.default, [cur], back, f"{c.name}_r{len(merged)}")
    back.args = (cur,) + tuple(back.args[1:])
    return True


def _lower_select(graph, view) -> bool:
    """view(x, S) read only by select(d, i) on one dim d: [prod(S[:d]), S[d], prod(S[d+1:])]."""
    import torch

    aten = torch.ops.aten
    if not _is(view, *VIEWS) or not view.users:
        return False
    users = list(view.users)
    if not all(_is(u, "aten.select.int") and u.args[0] is view for u in users):
        return False
    shape = tuple(view.meta["val"].shape)
    dims = {u.args[1] % len(shape) for u in users}
    if len(dims) != 1:
        return False
    (d,) = dims
    merged = ([_prod(shape[:d])] if d else []) + [shape[d]] + ([_prod(shape[d + 1:])] if d + 1 < len(shape) else [])
    nd = 1 if d else 0
    first = users[0]
    src = _viewed(graph, view.args[0], merged, first, f"{view.name}_c{len(merged)}")
    v2 = _new(graph, view.target, [src, merged], first, f"{view.name}_r{len(merged)}")
    for u in users:
        s = _new(graph, aten.select.int, [v2, nd, u.args[2]], u, f"{u.name}_r")
        back = _new(graph, aten.view.default, [s, list(u.meta["val"].shape)], u, f"{u.name}_v")
        u.replace_all_uses_with(back)
    return True


def _lower_expand(graph, unsq) -> bool:
    """unsqueeze(x, d) -> expand(sizes) -> clone -> view(T): non-expanded runs of dims merge."""
    import torch

    aten = torch.ops.aten
    if not _is(unsq, "aten.unsqueeze.default") or len(unsq.users) != 1:
        return False
    (exp,) = unsq.users
    if not _is(exp, "aten.expand.default") or len(exp.users) != 1:
        return False
    (clone,) = exp.users
    if not _is(clone, "aten.clone.default") or len(clone.users) != 1:
        return False
    (back,) = clone.users
    if not _is(back, *VIEWS) or _rank(back) > LOW_RANK:
        return False
    src = tuple(unsq.meta["val"].shape)
    wide = tuple(exp.meta["val"].shape)
    groups = []
    for i, (a, b) in enumerate(zip(src, wide)):
        grown = a != b
        if groups and not grown and not groups[-1][1]:
            groups[-1][0].append(i)
        else:
            groups.append(([i], grown))
    if len(groups) > LOW_RANK:
        return False
    # without a copy where the unsqueezed value's strides let the dims merge
    runs = [(run, grown) for g, grown in groups for run in _split_runs(unsq.meta["val"], [g])]
    if len(runs) <= LOW_RANK:
        groups = runs
    small = [_prod(src[i] for i in g) for g, _grown in groups]
    big = [_prod(wide[i] for i in g) for g, _grown in groups]
    x = _viewed(graph, unsq.args[0], small, back, f"{unsq.name}_c{len(small)}")
    v = _new(graph, aten.view.default, [x, small], back, f"{unsq.name}_r{len(small)}")
    e = _new(graph, aten.expand.default, [v, big], back, f"{exp.name}_r{len(small)}")
    c = _new(graph, aten.clone.default, [e], back, f"{clone.name}_r{len(small)}")
    back.args = (c,) + tuple(back.args[1:])
    return True
