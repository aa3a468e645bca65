"""Decompositions as data: an op a rule pack serves by a composition of other ops.

A pack's ``decompositions:`` (``torchfl.rules.decompose``) say, e.g., that scaled-dot-product
attention on a chip without an attention unit is ``bmm -> mul -> [mask] -> softmax -> bmm``.
Here they are applied by **graph rewrite**, then planned like any graph:

1. candidates of the captured graph as it is (the op's direct kernels, else its fallback);
2. every node a decomposition applies to is replaced by its parts (new FX nodes, their
   shapes computed by running the ATen ops on meta tensors), and the rewritten graph gets
   its own candidates: each part is matched against its own rules, priced by the same cost
   model, folded (input-independent parts, e.g. a causal mask) or falls back like any node,
   and fuses with its neighbours where a fusion pattern says so;
3. per node, the cheapest direct kernel of the op (1) against the sum of its parts' cheapest
   options (2); where the op has no kernel (it would fall back), the decomposition is taken
   when every part runs on the chip or folds (a fallback's price counts only its round trip,
   not the host's compute, so the planner never prefers it to a kernel; neither does this).
   A decomposition that loses is undone (listed as rejected with the reason: both prices, or
   the part that would fall back) and the graph is rewritten again with the winners only.

Why a rewrite rather than a multi-step candidate: the parts become ordinary nodes, so the
executor runs their kernels unchanged (nothing new to execute), layout selection and memory
planning see their intermediate values, fusion patterns apply across a part boundary, and
a part no kernel takes is an honest, listed fallback. The cost is planning the graph twice
when (and only when) a decomposition applies.

The plan lists each decomposition in ``plan.decomposed`` (node, op, rule, parts, both
prices) and ``explain`` under "Decomposed"; each part's step note names its decomposition.
"""

from __future__ import annotations

from dataclasses import replace

from torchfl.kernels.spec import numel as _prod
from torchfl.planner.plan import Decomposed
from torchfl.planner.texttable import human_time


def apply(captured, precision, target, ir, cands, pricer):
    """(captured, ir, cands, decisions): the graph with the decompositions that win on price."""
    proposals = _proposals(ir, target)
    if not proposals:
        return captured, ir, cands, ()
    rewritten, names = _rewrite(captured, proposals)
    ir2, cands2 = _candidates(rewritten, precision, target, pricer)
    winners, lost, decisions = {}, [], []
    best, best2 = cheapest(cands), cheapest(cands2)
    for node, (dec, _parts, _fx) in proposals.items():
        alt, alt_cost = best.get((node,), _NONE)
        parts = tuple(n for n in names[node] if n in ir2.nodes)
        cost = sum(best2.get((p,), _NONE)[1] for p in parts)
        off_chip = [p for p in parts if p in cands2.fallbacks]
        if alt == "cpu" and off_chip:
            why = f"part {off_chip[0]} ({ir2.nodes[off_chip[0]].op}) would fall back: {cands2.fallbacks[off_chip[0]]}"
        elif alt != "cpu" and cost >= alt_cost:
            why = f"its {len(parts)} parts {human_time(cost)} vs {human_time(alt_cost)} for {alt}"
        else:
            winners[node] = proposals[node]
            decisions.append(Decomposed(node, ir.nodes[node].op, dec.id, names[node],
                                        tuple(ir2.nodes[p].op if p in ir2.nodes else "" for p in names[node]),
                                        cost, alt, alt_cost))
            continue
        lost.append(((node,), f"decomposed ({dec.name})", (f"{dec.id}: {why}",)))
    if len(winners) != len(proposals):
        if not winners:
            cands.rejected.extend(lost)
            return captured, ir, cands, ()
        rewritten, names = _rewrite(captured, winners)
        ir2, cands2 = _candidates(rewritten, precision, target, pricer)
    cands2.rejected.extend(lost)
    for d in decisions:
        cands2.rejected.append(((d.parts[-1],), d.alternative,
                                (f"{human_time(d.alternative_time_s)} for {d.op} whole vs "
                                 f"{human_time(d.predicted_time_s)} for its decomposition {d.rule}",)))
    return rewritten, ir2, cands2, tuple(decisions)


def fold_repeat_kv(captured):
    """``captured`` with Hugging Face's ``repeat_kv`` folded into grouped-query attention.

    LLaMA-family models repeat each key/value head for its group before attention when they
    pass a mask (``x[:, :, None].expand(B, Hkv, G, L, D).reshape(B, Hkv * G, L, D)``: a rank-5
    unsqueeze/expand, a copy G times the size of K and V, and a view). That is exactly
    ``scaled_dot_product_attention(..., enable_gqa=True)`` on the unrepeated K and V, which
    the attention kernel reads in place (and a chip with max_rank 4 can then run at all).
    The same graph comes back when no attention reads such a chain. Then, the planner's other
    rewrite before planning: :func:`lower_rank` (views above rank 4 that only regroup data)."""
    import torch

    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    hits = []
    for node in captured.graph_module.graph.nodes:
        if node.target is sdpa and len(node.args) >= 3:
            k, v = (_repeated_kv(node.args[i]) for i in (1, 2))
            if k is not None and v is not None and k[1] == v[1] and not node.kwargs.get("dropout_p"):
                hits.append((node.name, k[0].name, v[0].name))
    if not hits:
        return lower_rank(captured)
    graph, by_name = _copy_graph(captured.graph_module.graph)
    for name, k, v in hits:
        node = by_name[name]
        chains = [node.args[1], node.args[2]]
        node.args = (node.args[0], by_name[k], by_name[v]) + tuple(node.args[3:])
        node.kwargs = {**node.kwargs, "enable_gqa": True}
        for tail in chains:          # the now unread view <- clone <- expand <- unsqueeze chain
            while tail is not None and tail.op == "call_function" and not tail.users:
                nxt = tail.args[0] if tail.args and isinstance(tail.args[0], torch.fx.Node) else None
                graph.erase_node(tail)
                tail = nxt
    return lower_rank(_with_graph(captured, graph, {}))


_VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")


def _repeated_kv(node):
    """(source node, group size) when ``node`` is repeat_kv(source), else None."""
    import torch

    def op(n, *names):
        return isinstance(n, torch.fx.Node) and n.op == "call_function" and str(n.target) in names

    if not op(node, *_VIEWS):
        return None
    x = node.args[0]
    if op(x, "aten.clone.default"):
        x = x.args[0]
    if not op(x, "aten.expand.default"):
        return None
    expanded, unsq = x, x.args[0]
    if op(unsq, "aten.slice.Tensor") and _whole_slice(unsq):    # `x[:, :, None, :, :]` keeps a full slice
        unsq = unsq.args[0]
    if not op(unsq, "aten.unsqueeze.default"):
        return None
    src = unsq.args[0]
    try:
        shape = tuple(src.meta["val"].shape)
        out = tuple(node.meta["val"].shape)
        wide = tuple(expanded.meta["val"].shape)
    except (AttributeError, KeyError):
        return None
    if len(shape) != 4 or unsq.args[1] not in (2, -3) or len(wide) != 5:
        return None
    B, Hkv, L, D = shape
    G = wide[2]
    if wide != (B, Hkv, G, L, D) or out != (B, Hkv * G, L, D):
        return None
    return src, G


def _whole_slice(node) -> bool:
    """A ``slice`` that keeps every element of its dim (start 0, end past the size, step 1)."""
    args = list(node.args) + [None] * (5 - len(node.args))
    _x, dim, start, end, step = args[:5]
    try:
        size = node.args[0].meta["val"].shape[dim if dim is not None else 0]
    except (AttributeError, KeyError, IndexError, TypeError):
        return False
    return (start in (None, 0)) and (end is None or end >= size) and step in (None, 1)


def _copy_graph(graph):
    import torch

    new = torch.fx.Graph()
    out = new.graph_copy(graph, {})
    new.output(out)
    return new, {n.name: n for n in new.nodes}


def _with_graph(captured, graph, renamed):
    import dataclasses

    import torch

    new_gm = torch.fx.GraphModule(captured.graph_module, graph)
    outputs = [renamed.get(o, o) if o is not None else None for o in captured.outputs]
    return dataclasses.replace(captured, graph_module=new_gm, outputs=outputs)


def annotate(plan, decisions):
    """The plan with ``decomposed`` set and each part's step note naming its decomposition."""
    if not decisions:
        return plan
    part_of = {p: d for d in decisions for p in d.parts}
    steps = []
    for st in plan.steps:
        d = next((part_of[n] for n in st.nodes if n in part_of), None)
        if d is not None:
            tag = f"decomposed {d.op.removeprefix('aten.')} [{d.node}] ({d.rule})"
            st = replace(st, note=f"{tag}; {st.note}" if st.note else tag)
        steps.append(st)
    return replace(plan, steps=tuple(steps), decomposed=tuple(decisions))


_NONE = ("cpu", float("inf"))   # no option covers the nodes


def cheapest(cands) -> dict[tuple, tuple[str, float]]:
    """Nodes -> the cheapest option covering exactly them, as (label, predicted time); the first
    of equal costs (one pass over the options: a scan per proposal was quadratic, 9.5 s of a
    LLaMA-2 70B plan's 22 s for its 1600 RMSNorm proposals over ~20,000 options)."""
    best: dict[tuple, tuple[str, float]] = {}
    for o in cands.options:
        if o.cost < best.get(o.nodes, _NONE)[1]:
            kind = o.payload.kind
            best[o.nodes] = (o.payload.kernel if kind in ("kernel", "fused") else
                             ("host fold" if kind == "fold" else "cpu"), o.cost)
    return best


def _proposals(ir, target) -> dict:
    """node name -> (decomposition, its parts, value names of the call's tensors)."""
    from torchfl.planner.candidates import CallBuilder
    from torchfl.rules.decompose import decompositions_for, expand

    out = {}
    for node in ir.nodes.values():
        decs = decompositions_for(target.packs, node.op)
        if not decs:
            continue
        builder = CallBuilder(ir)
        call, _sig = builder.call(node.fx, None, "d")
        for dec in decs:   # the first that applies (pack and file order)
            parts = expand(dec, target.hcd, call)
            if isinstance(parts, list):
                fx_of = {key: builder.values[path][1] for key, path in builder.path_of.items()}
                out[node.name] = (dec, parts, fx_of)
                break
    return out


def _candidates(captured, precision, target, pricer):
    from torchfl.planner.candidates import Generator
    from torchfl.planner.graph import build_ir

    ir = build_ir(captured, precision)
    return ir, Generator(ir, target.hcd, target.packs, target.model, pricer).run()


def _rewrite(captured, chosen):
    """A copy of ``captured`` with each chosen node replaced by its parts; and per node the
    FX names of its parts in order."""
    import torch

    graph, by_name = _copy_graph(captured.graph_module.graph)
    renamed, names = {}, {}
    for node_name, (dec, parts, fx_of) in chosen.items():
        node = by_name[node_name]
        made: dict[str, torch.fx.Node] = {}
        with graph.inserting_before(node):
            for part in parts:
                made[part.id] = _part_node(graph, node_name, part, made, fx_of, by_name)
        last = made[parts[-1].id]
        node.replace_all_uses_with(last)
        graph.erase_node(node)
        renamed[node_name] = last.name
        names[node_name] = tuple(n.name for n in made.values())
    return _with_graph(captured, graph, renamed), names


def _part_node(graph, owner, part, made, fx_of, by_name):
    """One FX node for ``part``, its ``meta['val']`` from running the op on meta tensors."""
    import torch

    from torchfl.rules.call import TensorMeta
    from torchfl.rules.decompose import Part

    op = _overload(part.op)

    def node_arg(v):
        if isinstance(v, Part):
            return made[v.id]
        if isinstance(v, TensorMeta):
            return by_name[fx_of[id(v)]]
        if isinstance(v, (list, tuple)):
            return type(v)(node_arg(x) for x in v)
        return v

    schema = {a.name: a for a in op._schema.arguments}
    args = tuple(node_arg(a) for a in part.args)
    kwargs = {}
    for k, v in part.kwargs.items():
        if isinstance(v, str) and k in schema and "ScalarType" in str(getattr(schema[k], "real_type", "")):
            v = getattr(torch, v)   # a dtype, written as its short name ('bool')
        kwargs[k] = node_arg(v)

    def meta(v):
        if isinstance(v, torch.fx.Node):
            val = v.meta["val"]
            return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device="meta")
        if isinstance(v, (list, tuple)):
            return type(v)(meta(x) for x in v)
        return v

    meta_kwargs = {k: meta(v) for k, v in kwargs.items()}
    if "device" in schema and not any(isinstance(a, torch.fx.Node) for a in args):
        meta_kwargs["device"] = torch.device("meta")   # a factory: its shape only; the node runs on the host
    try:
        val = op(*meta(args), **meta_kwargs)
    except Exception as exc:  # noqa: BLE001 - torch's own sentence, located in the pack
        raise ValueError(f"decomposition of {owner}: part {part.id} ({part.op}) fails on these shapes: {exc}") from exc
    new = graph.create_node("call_function", op, args, kwargs, name=f"{owner}_{part.id}")
    new.meta["val"] = val
    return new


def _overload(name: str):
    import torch

    ns, op, overload = name.split(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), op), overload)
    except AttributeError as exc:
        raise ValueError(f"decomposition part op {name} is not an ATen overload in torch {torch.__version__}") from exc


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
    graph, by_name = _copy_graph(gm.graph)
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
    return _with_graph(captured, graph, {})


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
    if not _is(view, *_VIEWS) or len(view.users) != 1:
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
    if not _is(back, *_VIEWS) or _rank(back) > LOW_RANK or any(len(c.users) != 1 for c in chain):
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
    if not _is(view, *_VIEWS) or not view.users:
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
    if not _is(back, *_VIEWS) or _rank(back) > LOW_RANK:
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
