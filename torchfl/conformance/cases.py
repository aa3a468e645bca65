"""Test cases: PyTorch's OpInfo sample inputs plus the project's edge cases.

A :class:`Case` is one call of an OpInfo's function on concrete inputs. From each OpInfo
and dtype come its first ``samples`` sample inputs (all of them with ``samples=None``) (in op_db's order, generated under a
fixed seed), and, from the first ``edge_from`` of them, variants that OpInfo does not
always cover: the same call on non-contiguous inputs (``strided``), on channels-last
4-D inputs (``channels_last``), with NaN, +inf and -inf in the first floating input
(``nan_inf``), with zero rows (``empty``) and with the second tensor broadcast along its
last dimension (``broadcast``). A variant eager torch rejects is dropped, not counted.

The layout a case is reported under is the memory layout of its inputs as the caller
hands them over: ``contiguous``, ``channels_last`` or ``strided``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VARIANTS = ("strided", "channels_last", "nan_inf", "empty", "broadcast")


@dataclass
class Case:
    """``opinfo.op(*args, **kwargs)`` with the tensors as leaves of ``(args, kwargs)``."""

    opinfo: str
    index: int            # the OpInfo sample it comes from
    variant: str          # "opinfo" or one of VARIANTS
    func: object
    args: tuple
    kwargs: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.opinfo}#{self.index}" + ("" if self.variant == "opinfo" else f"/{self.variant}")

    def leaves(self) -> list:
        """The tensor leaves, in pytree order (the compiled function's inputs)."""
        import torch
        import torch.utils._pytree as pytree

        return [x for x in pytree.tree_leaves((self.args, self.kwargs)) if isinstance(x, torch.Tensor)]

    def layout(self) -> str:
        import torch

        kinds = set()
        for t in self.leaves():
            if t.is_contiguous():
                continue
            if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
                kinds.add("channels_last")
            else:
                kinds.add("strided")
        return "strided" if "strided" in kinds else ("channels_last" if kinds else "contiguous")

    def call(self):
        """Run eagerly on copies of the inputs (same strides)."""
        args, kwargs = _copied((self.args, self.kwargs))
        return self.func(*args, **kwargs)

    def as_function(self):
        """``(fn, leaves)``: ``fn(*leaves)`` makes the call; everything else is a constant.

        ``fn`` rebuilds the arguments from a template made here (:func:`_template`), not with
        pytree: Dynamo traces ``fn`` for every case of a joint graph, and tracing
        ``tree_unflatten`` cost 8x the op itself (max_pool2d, 48 cases: 2.4-2.8 s against 0.3 s
        of CPU, the same graph). Arguments nested beyond one list or tuple keep the pytree path."""
        import torch
        import torch.utils._pytree as pytree

        flat, spec = pytree.tree_flatten((self.args, self.kwargs))
        slots = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        leaves = [flat[i] for i in slots]
        func = self.func
        direct = _template(self.args, self.kwargs, leaves)
        if direct is not None:
            args_t, kwargs_t = direct
            n = len(leaves)
            if all(type(a) is _Slot and a.i == k for k, a in enumerate(args_t[:n])) and \
                    not any(type(a) in (_Slot, _Seq) for a in (*args_t[n:], *kwargs_t.values())):
                rest = tuple(args_t[n:])   # the tensors lead: the commonest call, the cheapest to trace

                def fn(*tensors):
                    return func(*tensors, *rest, **kwargs_t)

                return fn, leaves

            def fn(*tensors):
                return func(*[_fill(a, tensors) for a in args_t], **{k: _fill(v, tensors) for k, v in kwargs_t.items()})

            return fn, leaves

        def fn(*tensors):
            items = list(flat)
            for i, t in zip(slots, tensors):
                items[i] = t
            args, kwargs = pytree.tree_unflatten(items, spec)
            return func(*args, **kwargs)

        return fn, leaves

    def describe(self) -> dict:
        """JSON-able inputs: each tensor's dtype, shape and strides; the other arguments by repr."""
        import torch
        import torch.utils._pytree as pytree

        def one(x):
            if isinstance(x, torch.Tensor):
                return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)} strides {list(x.stride())}"
            text = repr(x)
            return text if len(text) <= 80 else text[:77] + "..."

        return {"case": self.label, "args": [pytree.tree_map(one, a) for a in self.args],
                "kwargs": {k: pytree.tree_map(one, v) for k, v in self.kwargs.items()}}


class _Slot:
    """The ``i``-th tensor input of a case's function."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


class _Seq:
    """A list or tuple argument holding tensor inputs."""

    __slots__ = ("kind", "items")

    def __init__(self, kind, items):
        self.kind, self.items = kind, items


def _fill(x, tensors):
    if type(x) is _Slot:
        return tensors[x.i]
    if type(x) is _Seq:
        return x.kind([_fill(e, tensors) for e in x.items])
    return x


def _template(args, kwargs, leaves):
    """(args, kwargs) with each tensor replaced by its :class:`_Slot` and each plain list or
    tuple of tensors by a :class:`_Seq`, in ``leaves``' order; None where a tensor sits deeper
    or in another container (the caller keeps pytree)."""
    import torch

    found: list = []

    def one(x, depth):
        if isinstance(x, torch.Tensor):
            found.append(x)
            return _Slot(len(found) - 1)
        if type(x) in (list, tuple) and any(isinstance(e, torch.Tensor) for e in x):
            if depth:
                raise LookupError
            return _Seq(type(x), [one(e, 1) for e in x])
        if type(x) in (list, tuple, dict) and _has_tensor(x):
            raise LookupError
        return x

    try:
        args_t = [one(a, 0) for a in args]
        kwargs_t = {k: one(v, 0) for k, v in kwargs.items()}
    except LookupError:
        return None
    if len(found) != len(leaves) or any(a is not b for a, b in zip(found, leaves)):
        return None   # not pytree's order: keep pytree
    return args_t, kwargs_t


def _has_tensor(x) -> bool:
    import torch
    import torch.utils._pytree as pytree

    return any(isinstance(e, torch.Tensor) for e in pytree.tree_leaves(x))


def _copied(tree):
    import torch
    import torch.utils._pytree as pytree

    def copy(x):
        if isinstance(x, torch.Tensor):
            out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
            out.copy_(x)
            return out
        return x

    return pytree.tree_map(copy, tree)


def opinfo_cases(name: str, dtype, *, samples: int | None, edge_from: int, seed: int = 0) -> list[Case]:
    """The cases of OpInfo ``name`` in torch dtype ``dtype`` (see the module docstring);
    ``samples=None``: every sample op_db generates."""
    import torch

    from torchfl.conformance.opinfos import lookup

    info = lookup(name)
    torch.manual_seed(seed)
    with torch.no_grad():
        drawn = []
        for s in info.sample_inputs("cpu", dtype, requires_grad=False):
            drawn.append(s)
            if samples is not None and len(drawn) >= samples:
                break
    cases = []
    for i, s in enumerate(drawn):
        base = Case(name, i, "opinfo", info.op, (s.input, *s.args), dict(s.kwargs))
        cases.append(base)
        if i < edge_from:
            cases.extend(_variants(base, s))
    return cases


def _variants(base: Case, sample) -> list[Case]:
    import torch

    out = []
    nc = sample.noncontiguous()
    out.append(Case(base.opinfo, base.index, "strided", base.func, (nc.input, *nc.args), dict(nc.kwargs)))
    out.append(_map_case(base, "channels_last", lambda t: t.contiguous(memory_format=torch.channels_last)
                         if t.dim() == 4 else t))
    first_float = _first(base, lambda t: t.is_floating_point() and t.numel() >= 3)
    if first_float is not None:
        def specials(t, target=first_float):
            if t is not target:
                return t
            t = t.clone()   # same strides; the first three elements in index order
            where = torch.unravel_index(torch.arange(3), t.shape)
            t[where] = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=t.dtype)
            return t
        out.append(_map_case(base, "nan_inf", specials))
    first = _first(base, lambda t: t.dim() >= 1 and t.shape[0] > 0)
    if first is not None:
        rows = first.shape[0]
        out.append(_map_case(base, "empty", lambda t: t[:0] if t.dim() >= 1 and t.shape[0] == rows else t))
    tensors = [t for t in base.leaves() if t.is_floating_point() and t.dim() >= 1]
    if len(tensors) >= 2 and tensors[0].shape == tensors[1].shape and tensors[1].shape[-1] > 1:
        second = tensors[1]
        out.append(_map_case(base, "broadcast", lambda t: t[..., :1].contiguous() if t is second else t))
    return [c for c in out if c is not None and _differs(c, base)]


def _first(case: Case, pred):
    for t in case.leaves():
        if pred(t):
            return t
    return None


def _map_case(base: Case, variant: str, fn) -> Case | None:
    import torch
    import torch.utils._pytree as pytree

    args, kwargs = pytree.tree_map(lambda x: fn(x) if isinstance(x, torch.Tensor) else x, (base.args, base.kwargs))
    return Case(base.opinfo, base.index, variant, base.func, tuple(args), dict(kwargs))


def _differs(case: Case, base: Case) -> bool:
    """A variant that changed nothing (no 4-D input for channels_last, ...) is not a case."""
    a, b = case.leaves(), base.leaves()
    return len(a) != len(b) or any(x is not y for x, y in zip(a, b))
