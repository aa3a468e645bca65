"""One plan across sequence lengths: a Dynamo graph with symbolic sizes is captured once and
planned once per *bucket* of its sizes; each concrete length is an instance of that plan.

Why: after the second length Dynamo hands over one shape-polymorphic graph (a decoder's KV
cache grows by one token a call). Capturing (``torch.export``) and planning every length anew
cost seconds per token; a 64-token decode made 64 plans.

How:

* **one capture per graph**: ``torch.export`` with the graph's symbolic dimensions marked
  dynamic (:func:`capture_symbolic`); a concrete length is that graph with its symbols bound
  (:func:`specialise`: every value's shape and every size argument evaluated, no re-trace);
* **one decision per bucket**: the first length of a bucket is planned in full (candidates,
  prices, exact selection); the bucket keeps the selection's choices (which kernel, fusion,
  layout and host route covers each node). The bucket rule (:func:`bucket_of`): each
  symbolic size ``n`` falls in ``(lo, hi]`` with ``hi`` the smallest power of 8 >= max(n, 64)
  (lengths 1..64, 65..512, 513..4096, ...): a 256-token decode after a short prompt makes two
  decisions;
* **an instance per length**: the same choices on the specialised graph, re-checked against
  the rules' guards and the chip's hard constraints at that length (the candidates are
  generated and priced again: tiles, bytes and times are those of this length) and with its
  own memory plan; no selection is run. Where a choice no longer matches at a length (a guard
  fails, a tile no longer fits), that length is planned in full and starts a bucket of its
  own: nothing runs with a choice the rules refuse.

``plan.notes`` of every plan made here names the bucket it covers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = ["bucket_of", "capture_symbolic", "specialise", "LengthPlanner", "BUCKET_BASE", "BUCKET_MIN"]

BUCKET_BASE = 8      # bucket upper bounds are powers of this ...
BUCKET_MIN = 64      # ... from this one up


def bucket_of(n: int) -> tuple[int, int]:
    """``(lo, hi)``: the bucket ``lo < n <= hi`` of a symbolic size (module docstring)."""
    n = int(n)
    hi, lo = BUCKET_MIN, 0
    while n > hi:
        lo, hi = hi, hi * BUCKET_BASE
    return lo, hi


def is_symbolic(gm) -> bool:
    """Does this Dynamo graph take symbolic sizes (SymInt inputs or symbolic tensor dims)?"""
    import torch

    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("example_value", n.meta.get("val"))
        if isinstance(v, torch.SymInt):
            return True
        if isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in v.shape):
            return True
    return False


# ---------------------------------------------------------------- capture once

@dataclass
class Symbolic:
    """A graph captured with symbolic sizes, and how to bind its symbols from the inputs."""

    captured: object                  # planner.capture.Captured (meta vals carry SymInts)
    binders: list                     # (symbol, user input position, dim or None for an int input)
    ranges: dict                      # symbol -> (lower, upper) the export's guards allow
    symbols: tuple = field(default=())
    fixed: dict = field(default_factory=dict)   # node name -> its size-free val made concrete (specialise)

    def bindings(self, inputs) -> dict:
        """symbol -> value for the concrete ``inputs`` (user inputs, graph order)."""
        out = {}
        for sym, pos, dim in self.binders:
            a = inputs[pos]
            value = int(a) if dim is None else int(a.shape[dim])
            if out.setdefault(sym, value) != value:
                raise ValueError(f"size {sym} is {out[sym]} and {value} in the same call")
        return out

    def admits(self, bind: dict) -> bool:
        """Do these sizes satisfy the guards torch.export recorded for the symbols?"""
        for sym, value in bind.items():
            lo, hi = self.ranges.get(sym, (None, None))
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                return False
        return True


def _takes_varargs(module) -> bool:
    import inspect

    return any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in inspect.signature(module.forward).parameters.values())


def capture_symbolic(gm, inputs, dynamic_shapes=None) -> Symbolic | None:
    """Capture a (weights-lifted) Dynamo graph, or any module, once, with symbolic sizes.

    ``inputs`` are the concrete user inputs of one call. ``dynamic_shapes`` (torch.export's,
    one entry per input) says which dimensions are symbolic; by default those that Dynamo
    traced symbolically in ``gm``'s placeholders. Returns None when no dimension is symbolic
    (nothing to share between sizes)."""
    import torch
    from torch.export import Dim

    from torchfl.planner.capture import CaptureError, drop_same_device, export_captured

    if dynamic_shapes is None:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(inputs):
            return None
        dynamic_shapes = []
        for p, a in zip(placeholders, inputs):
            v = p.meta.get("example_value", p.meta.get("val"))
            if isinstance(a, torch.Tensor) and isinstance(v, torch.Tensor):
                dims = {d: Dim.AUTO for d, s in enumerate(v.shape) if not isinstance(s, int)}
                dynamic_shapes.append(dims or None)
            elif isinstance(v, torch.SymInt) and isinstance(a, int):
                # a size Dynamo passes as a number (a cache's length that the model adds to
                # positions): symbolic too, else export burns the first call's value in
                dynamic_shapes.append(Dim.AUTO)
            else:
                dynamic_shapes.append(None)
    if not any(torch.utils._pytree.tree_leaves(dynamic_shapes, is_leaf=lambda x: isinstance(x, dict))):
        return None
    shapes = dynamic_shapes
    if isinstance(gm, torch.fx.GraphModule) and _takes_varargs(gm):
        # Dynamo hands a lazily compiled GraphModule whose forward is ``(*args, **kwargs)``:
        # torch.export reads that as one input and refuses one entry per placeholder. The same
        # graph in a plain GraphModule has its generated, one-parameter-per-placeholder forward.
        gm = torch.fx.GraphModule(gm, gm.graph)
    try:
        captured, ep = export_captured(gm, tuple(inputs), tuple(shapes))
    except Exception as exc:  # noqa: BLE001 - torch.export raises a dozen types of its own: one CaptureError, raised
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CaptureError(f"torch.export could not capture the graph with symbolic sizes: {first}") from exc
    drop_same_device(captured.graph_module)
    binders = []
    user = 0
    flat_shapes = torch.utils._pytree.tree_leaves(shapes, is_leaf=lambda x: isinstance(x, dict) or x is None)
    for n in captured.graph_module.graph.nodes:
        if n.op != "placeholder":
            continue
        if not any(name == n.name and kind == "input" for name, kind, _t in captured.placeholders):
            continue
        v = n.meta.get("val")
        asked = flat_shapes[user] if user < len(flat_shapes) else None
        if isinstance(v, torch.SymInt):
            if _symbol(v) is not None:
                binders.append((_symbol(v), user, None))
        elif isinstance(v, torch.Tensor):
            for d, s in enumerate(v.shape):
                if isinstance(s, torch.SymInt) and _symbol(s) is not None:
                    binders.append((_symbol(s), user, d))
        if _specialised(asked, v):
            return None     # export fixed a size asked to be symbolic: this graph holds one length
        user += 1
    ranges = {}
    for sym, vr in ep.range_constraints.items():
        ranges[sym] = (_bound(vr.lower), _bound(vr.upper))
    return Symbolic(captured, binders, ranges, tuple(dict.fromkeys(b[0] for b in binders)))


def _specialised(asked, val) -> bool:
    """Did torch.export make a size constant that was asked to be symbolic (``asked``: the
    input's dynamic_shapes entry), or an expression the inputs cannot bind? Either way the
    graph is valid for the captured sizes only."""
    import torch

    if asked is None:
        return False
    if isinstance(val, torch.SymInt):
        return _symbol(val) is None
    if isinstance(asked, dict) and isinstance(val, torch.Tensor):
        return any(not isinstance(val.shape[d], torch.SymInt) or _symbol(val.shape[d]) is None
                   for d in asked if d < val.dim())
    return not isinstance(val, torch.SymInt)


def _bound(b):
    """A range bound as an int, None for an infinite one (sympy's oo or torch's int_oo)."""
    return int(b) if getattr(b, "is_Integer", False) else None


def _symbol(s):
    """The sympy symbol a SymInt is, or None when it is an expression of symbols."""
    expr = s.node.expr
    return expr if getattr(expr, "is_Symbol", False) else None


def _sized(v) -> bool:
    """Does a node's val hold a symbolic size (in a shape, a stride or a number)?"""
    import torch

    if isinstance(v, torch.SymInt):
        return True
    if isinstance(v, torch.Tensor):
        return any(not isinstance(s, int) for s in (*v.shape, *v.stride()))
    if isinstance(v, (list, tuple)):
        return any(_sized(x) for x in v)
    return False


def specialise(sym: Symbolic, inputs):
    """The symbolic capture with its sizes bound to those of ``inputs``: a concrete Captured
    (every node's ``val`` a meta tensor of this length's shape, every size argument an int),
    without tracing the model again."""
    import torch
    from torch.fx._lazy_graph_module import _LazyGraphModule
    from torch.fx.node import map_arg

    from torchfl.planner.capture import Captured

    bind = sym.bindings(inputs)
    src = sym.captured
    graph = torch.fx.Graph()     # node by node, each node's meta dict copied (not its values)
    out = graph.graph_copy(src.graph_module.graph, {})
    graph.output(out)
    fixed = sym.fixed
    memo: dict = {}              # a size expression's value at this length (sympy is slow)

    def size(s):
        if isinstance(s, int):
            return s
        expr = s.node.expr
        value = memo.get(expr)
        if value is None:
            value = memo[expr] = int(expr.xreplace(bind))
        return value

    def concrete(v):
        if isinstance(v, torch.SymInt):
            return size(v)
        if isinstance(v, torch.Tensor):
            return torch.empty_strided([size(s) for s in v.shape], [size(s) for s in v.stride()], dtype=v.dtype,
                                       device="meta")
        if isinstance(v, (list, tuple)):
            return type(v)(concrete(x) for x in v)
        return v

    ints = {}
    for n in graph.nodes:
        v = n.meta.get("val")
        if v is None:
            continue
        hit = fixed.get(n.name)
        if hit is not None:      # no size in it: made concrete once, shared by every length
            n.meta["val"] = hit
            continue
        n.meta["val"] = concrete(v)
        if isinstance(v, torch.SymInt):
            ints[n] = n.meta["val"]
        elif not _sized(v):
            fixed[n.name] = n.meta["val"]
    if ints:
        for n in list(ints.keys()):      # only the nodes that read a size change their arguments
            for user in list(n.users):
                user.args = map_arg(user.args, lambda a: ints.get(a, a))
                user.kwargs = map_arg(user.kwargs, lambda a: ints.get(a, a))
        for n in reversed(list(graph.nodes)):
            if n in ints and n.op == "call_function" and not n.users:
                graph.erase_node(n)
    # lazy: the planner reads the graph, never its Python code; generating that code was a
    # third of a decode token's instance (torch's own class for passes that only read a graph)
    gm = _LazyGraphModule(src.graph_module, graph)
    return Captured(gm, list(src.placeholders), dict(src.tensors), list(src.outputs), src.training,
                    dict(src.extra))


# ---------------------------------------------------------------- plan once per bucket

class NotInBucket(Exception):
    """A bucket's choices do not all match at this length (a guard fails, a tile does not fit)."""


@dataclass
class _Bucket:
    lo: dict
    hi: dict
    chosen: tuple          # option keys, in the selection's order
    selection: object      # the decision's Selection (order, layouts)
    first: dict            # the sizes the decision was made at
    lengths: set = field(default_factory=set)


class LengthPlanner:
    """Plans of one symbolic Dynamo graph: captured once, decided once per bucket, instanced
    per length (module docstring). ``decisions`` counts the full plans made."""

    def __init__(self, gm, target, precision=None, strict=False):
        self.gm, self.target, self.precision, self.strict = gm, target, precision, strict
        self.lifted = None
        self.user = None
        self.symbolic = None
        self.buckets: dict = {}
        self.decisions = 0
        self.instances = 0
        self.last_bucket = None     # the key of the bucket the last plan() belongs to

    def plan(self, args):
        """(plan, positions of the user inputs among ``args``) for this call's sizes."""
        from torchfl.planner.api import plan_specialised
        from torchfl.planner.capture import lift_static

        if self.lifted is None:
            self.lifted, self.user = lift_static(self.gm, args)
        inputs = tuple(args[i] for i in self.user)
        if self.symbolic is None:
            self.symbolic = capture_symbolic(self.lifted, inputs)
            if self.symbolic is None:
                return None
        bind = self.symbolic.bindings(inputs)
        if not self.symbolic.admits(bind):
            return None
        key = tuple(sorted((str(s), bucket_of(v)) for s, v in bind.items()))
        captured = specialise(self.symbolic, inputs)
        bucket = self.buckets.get(key)
        if bucket is not None:
            try:
                plan = plan_specialised(captured, inputs, self.target, self.precision, self.strict,
                                        decide=forced(bucket.chosen, bucket.selection))
                bucket.lengths.add(tuple(sorted(bind.values())))
                self.instances += 1
                self.last_bucket = key
                return self._noted(plan, bucket, bind), self.user
            except NotInBucket:
                key = key + (("from", tuple(sorted((str(s), v) for s, v in bind.items()))),)
        kept = {}
        plan = plan_specialised(captured, inputs, self.target, self.precision, self.strict, keep=kept)
        self.decisions += 1
        lo = {str(s): bucket_of(v)[0] + 1 for s, v in bind.items()}
        hi = {str(s): bucket_of(v)[1] for s, v in bind.items()}
        sel = kept["selection"]
        bucket = self.buckets[key] = _Bucket(lo, hi, tuple(choice(o) for o in sel.chosen), sel,
                                             {str(s): v for s, v in bind.items()})
        bucket.lengths.add(tuple(sorted(bind.values())))
        self.last_bucket = key
        return self._noted(plan, bucket, bind), self.user

    def _noted(self, plan, bucket, bind):
        here = {str(k): v for k, v in bind.items()}
        names = sorted(bucket.lo)
        same = len({(bucket.lo[n], bucket.hi[n], bucket.first[n], here[n]) for n in names}) == 1
        if same:      # Dynamo gives each cache tensor its own symbol; they are one length here
            n = names[0]
            sizes = f"{'size' if len(names) == 1 else 'sizes'} {', '.join(names)} in {bucket.lo[n]}..{bucket.hi[n]}"
            at, this = str(bucket.first[n]), str(here[n])
        else:
            sizes = ", ".join(f"{s} in {bucket.lo[s]}..{bucket.hi[s]}" for s in names)
            at = ", ".join(f"{s}={bucket.first[s]}" for s in names)
            this = ", ".join(f"{s}={here[s]}" for s in names)
        note = (f"lengths: one plan for {sizes} (decided at {at}; this instance {this}; buckets up to powers of "
                f"{BUCKET_BASE} from {BUCKET_MIN})")
        return dataclasses.replace(plan, notes=(note,) + tuple(plan.notes))


def choice(option) -> tuple:
    """What identifies an option across lengths: its key (kernel, nodes, output layout) and the
    layouts it reads its inputs in (one key has an option per input layout)."""
    return (option.key, tuple(option.layouts_in))


def forced(choices, selection):
    """``decide`` for the planner: the Selection that takes exactly ``choices`` (:func:`choice`
    of each option of a bucket's decision) among this length's candidates; NotInBucket if one
    is missing (its rule's guards or its kernel's tiling refuse this length)."""
    from torchfl.planner.select import Selection

    def decide(problem):
        by_key = {choice(o): o for o in problem.options}
        missing = [k for k in choices if k not in by_key]
        if missing:
            raise NotInBucket(f"{len(missing)} choice(s) of the bucket are not candidates at this length "
                              f"(e.g. {missing[0]})")
        chosen = tuple(by_key[k] for k in choices)
        return Selection(chosen, dict(selection.layouts), float(sum(o.cost for o in chosen)), selection.order,
                         selection.exact, selection.max_states)
    return decide
