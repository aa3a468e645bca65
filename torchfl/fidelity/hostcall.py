"""A fidelity table's row as a real call: the ATen overload of its ``op`` with random inputs of
its shapes bound by schema name (:func:`call_row`), and the schema-type tests the host's
model rows share with it. Rebuilding any row's call from the CSV alone is what lets a row be
timed again, anywhere."""

from __future__ import annotations


def _overload(op: str):
    import torch

    parts = op.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        raise ValueError(f"op {op!r} is not an ATen overload name like aten.mm.default")
    packet = getattr(torch.ops.aten, parts[1], None)
    fn = getattr(packet, parts[2], None) if packet is not None else None
    if fn is None:
        raise ValueError(f"op {op!r}: torch {torch.__version__} has no such ATen overload")
    return fn


def tensor_kind(t) -> str | None:
    """'one', 'list' or None for a schema argument type."""
    s = str(t).replace(" ", "")
    if s in ("Tensor", "Tensor?", "Optional[Tensor]"):
        return "one"
    if s in ("Tensor[]", "Tensor?[]", "List[Tensor]", "List[Optional[Tensor]]"):
        return "list"
    return None


def _is_index(name: str) -> bool:
    """Schema arguments that take integer index tensors (embedding's ``indices``, gather's ``index``)."""
    return name in ("indices", "index", "offsets", "input_ids")


def jsonable(v):
    import torch

    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def _unjson(v, schema_type: str):
    import torch

    if isinstance(v, str) and v.startswith("torch."):
        return getattr(torch, v.split(".", 1)[1])
    return v


def call_row(op: str, shapes, dtype: str, args: dict, *, device: str = "cpu", seed: int = 0):
    """``(fn, inputs)``: the overload and random inputs for a table row (floats ~N(0, 1) in
    ``dtype``; index arguments such as embedding's ``indices``: int64 zeros), bound by schema
    name, so ``fn()`` makes the call."""
    import torch

    ovl = _overload(op)
    g = torch.Generator().manual_seed(seed)
    shapes = [tuple(s) for s in shapes]

    def tensor(shape, name):
        if _is_index(name) or dtype not in ("float32", "float16", "bfloat16", "float64"):
            # index tensors (embedding's indices, gather's index) are int64 whatever the row's dtype;
            # zeros are valid indices into any non-empty dimension
            return torch.zeros(shape, dtype=torch.int64 if _is_index(name) else getattr(torch, dtype), device=device)
        return torch.randn(shape, generator=g).to(getattr(torch, dtype)).to(device)

    # the shapes fill the schema's tensor arguments in order (an explicit null skips one); a
    # list argument (cat's tensors) takes the shapes the later tensor arguments leave over
    tensor_args = [a for a in ovl._schema.arguments if tensor_kind(a.type)
                   and not (a.name in args and args[a.name] is None)]
    lists = [a for a in tensor_args if tensor_kind(a.type) == "list"]
    fill: dict = {}
    rest = list(shapes)
    for i, a in enumerate(tensor_args):
        if not rest:
            if str(a.type).replace(" ", "") in ("Tensor", "Tensor[]", "List[Tensor]"):
                raise ValueError(f"{op}: {len(shapes)} tensor shape(s) given, its schema takes "
                                 f"{', '.join(t.name for t in tensor_args)}")
            break
        if a in lists:
            later = len(tensor_args) - i - 1
            take = max(0, len(rest) - later)
            fill[a.name], rest = [tensor(s, a.name) for s in rest[:take]], rest[take:]
        else:
            fill[a.name], rest = tensor(rest[0], a.name), rest[1:]
    if rest:
        raise ValueError(f"{op}: {len(shapes)} tensor shape(s) given, its schema takes "
                         f"{', '.join(t.name for t in tensor_args)}")
    pos, kw = [], {}
    by_name = False                  # after an argument left at its default, the rest go by name
    for a in ovl._schema.arguments:
        if a.name in fill:
            value = fill[a.name]
        elif tensor_kind(a.type) and (a.name in args or str(a.type).replace(" ", "") in
                                          ("Tensor?", "Optional[Tensor]")):
            if a.name not in args and a.has_default_value():
                by_name = True
                continue
            value = None             # an optional tensor left out (or null): absent
        elif a.name in args:
            value = _unjson(args[a.name], str(a.type))
        elif a.has_default_value():
            by_name = True
            continue
        else:
            raise ValueError(f"{op}: argument {a.name!r} has no value in args and no default")
        if a.kwarg_only or by_name:
            kw[a.name] = value
        else:
            pos.append(value)
    return (lambda: ovl(*pos, **kw)), (pos, kw)
