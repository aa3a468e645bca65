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

from torchfl.planner.lowrank import VIEWS, copy_graph, lower_rank, with_graph
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
    graph, by_name = copy_graph(captured.graph_module.graph)
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
    return lower_rank(with_graph(captured, graph, {}))




def _repeated_kv(node):
    """(source node, group size) when ``node`` is repeat_kv(source), else None."""
    import torch

    def op(n, *names):
        return isinstance(n, torch.fx.Node) and n.op == "call_function" and str(n.target) in names

    if not op(node, *VIEWS):
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

    graph, by_name = copy_graph(captured.graph_module.graph)
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
        by_name[node_name] = last   # a later decomposed node that reads this one (chained writes into slices)
        renamed[node_name] = last.name
        names[node_name] = tuple(n.name for n in made.values())
    return with_graph(captured, graph, renamed), names


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
    if ns == "torchfl":        # torchfl's own operators exist once registered (whatever was imported first)
        from torchfl.kernels.grouped.torchop import register

        register()
    try:
        return getattr(getattr(getattr(torch.ops, ns), op), overload)
    except AttributeError as exc:
        raise ValueError(f"decomposition part op {name} is not an ATen overload in torch {torch.__version__}") from exc
