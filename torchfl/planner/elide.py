"""Clone elision in compiled graphs: a copy no one can tell from its input is removed.

Eval-mode dropout leaves ``aten.clone.default`` in an exported ATen graph (BERT-base: 25 full
copies of the hidden state). In a graph compiled whole, a clone's result can differ from its
input only if one of them is written later, or if it leaves the graph (the caller may write
to it, or to the input, after the call). So a clone (or ``contiguous``) is removed and its
readers read its input (no step at all, not even a metadata view's per-call work) when

- its result is no graph output, and no view of it is one;
- no node of the graph writes to it, to its input, or to anything sharing storage with either
  (decided from each op's schema: a mutable argument is a write, an aliasing return a view;
  functionalised graphs write only in trailing ``copy_`` into inputs, but this is checked,
  not assumed; an unknown call taking a tensor counts as writing it);
- its ``memory_format`` keeps the input's layout (none, ``preserve_format``, or the format the
  input already has).

Only the compiled entries call this (``api.plan_module``, ``plan_graph``, ``plan_dynamo``,
``plan_training``): the eager device's one-op and lazy plans go through ``plan_captured`` and
still copy (a user's ``y = x.clone(); x.add_(1)`` must leave ``y`` alone). The elided nodes are
listed in the plan's notes (``captured.extra["notes"]``) for explain.
"""
from __future__ import annotations

import operator

CLONES = ("aten.clone.default", "aten.contiguous.default")


def elide_clones(captured):
    """Remove the elidable clones of ``captured.graph_module`` in place (see the module
    docstring) and note them in ``captured.extra["notes"]``; returns ``captured``."""
    import torch

    gm = captured.graph_module
    graph = gm.graph
    root = _storage_roots(graph)
    written = _written_roots(graph, root)
    out = next(n for n in graph.nodes if n.op == "output")
    leaving = {root[n] for n in torch.utils._pytree.tree_leaves(out.args[0]) if isinstance(n, torch.fx.Node)}
    elided, kept = [], []
    for node in list(graph.nodes):
        if node.op != "call_function" or str(node.target) not in CLONES:
            continue
        why = _refusal(node, root, written, leaving)
        if why:
            kept.append(f"{node.name} ({why})")
            continue
        node.replace_all_uses_with(node.args[0])
        graph.erase_node(node)
        elided.append(node.name)
    if elided:
        gm.recompile()
        notes = captured.extra.setdefault("notes", [])
        notes.append(f"clones elided ({len(elided)}): {', '.join(elided)} removed, their readers read their input "
                     "(no step, no bytes move): no graph output is or views them, and no node writes to them or their input")
    if kept:
        captured.extra.setdefault("notes", []).append(f"clones kept as copies: {'; '.join(kept)}")
    return captured


def _refusal(node, root, written, leaving) -> str:
    """Why ``node`` (a clone) must stay a copy, or "" when it may alias its input."""
    import torch

    src = node.args[0] if node.args else None
    if not isinstance(src, torch.fx.Node) or not isinstance(src.meta.get("val"), torch.Tensor):
        return "its input is not a traced tensor"
    if root[node] in leaving:
        return "its result leaves the graph"
    if root[node] in written or root[src] in written:
        return "a node of the graph writes to it or its input"
    fmt = node.kwargs.get("memory_format", node.args[1] if len(node.args) > 1 else None)
    if fmt is None or fmt is torch.preserve_format:
        return ""
    if fmt in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d) and \
            src.meta["val"].is_contiguous(memory_format=fmt):
        return ""
    return f"memory_format {fmt} changes the input's layout"


def _storage_roots(graph) -> dict:
    """Node -> the node whose storage it shares (itself unless a return of its op aliases an
    argument, by the schema's alias sets; a ``getitem`` shares its producer's)."""
    import torch

    root = {}
    for node in graph.nodes:
        root[node] = node
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            root[node] = root[node.args[0]]
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            continue
        sets = {frozenset(r.alias_info.before_set) for r in schema.returns if r.alias_info is not None}
        for arg, value in _schema_args(schema, node):
            if arg.alias_info is not None and frozenset(arg.alias_info.before_set) in sets and \
                    isinstance(value, torch.fx.Node):
                root[node] = root[value]
                break
    return root


def _written_roots(graph, root) -> set:
    """Roots of every value a node writes to: a schema argument marked mutable; every tensor
    argument of a call whose target has no schema (other than ``getitem``)."""
    import torch

    written = set()
    for node in graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            written.update(root[a] for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor))
            continue
        for arg, value in _schema_args(schema, node):
            if arg.alias_info is not None and arg.alias_info.is_write:
                for v in torch.utils._pytree.tree_leaves(value):
                    if isinstance(v, torch.fx.Node):
                        written.add(root[v])
    return written


def _schema_args(schema, node):
    """(schema argument, the node's value for it) for every argument the call gives."""
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            yield arg, node.args[i]
        elif arg.name in node.kwargs:
            yield arg, node.kwargs[arg.name]
