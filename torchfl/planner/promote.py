"""Operand promotion: an elementwise op whose tensor operands differ in dtype gets explicit casts.

torch computes ``half_tensor < torch.tensor(0.5)``, ``int_ids * float_scale`` or ``int_ids * 0.5``
after promoting its operands to one dtype (``torch.result_type``: a float outranks an integer, a dimensioned tensor
outranks a 0-d one of the same kind). The chip's elementwise kernels compute in one dtype and
refuse the rest ("inputs must all be float16 ... insert a cast"); only add / sub / mul / div / pow
convert an *integer second* operand on load (``kernels.elementwise.PROMOTE``). This pass inserts
that cast as a graph node (``aten._to_copy`` to the promoted dtype, a cast kernel on the chip)
before the op, for every other operand whose dtype is not the promoted one, so the op runs on the
chip instead of falling back to the host.

Under a precision policy every float value is the policy's dtype on the chip (``graph.py``), so
float operands never differ there: only integer / bool operands of float arithmetic are cast.
"""
from __future__ import annotations

#: op -> (positions of its promoted tensor operands, torch's promotion kind)
_DEFAULT, _INT_TO_FLOAT = "DEFAULT", "INT_TO_FLOAT"
OPERANDS = {
    **{f"aten.{op}.Tensor": ((0, 1), _DEFAULT) for op in ("add", "sub", "mul", "eq", "ne", "lt", "le", "gt", "ge")},
    "aten.div.Tensor": ((0, 1), _INT_TO_FLOAT),
    "aten.minimum.default": ((0, 1), _DEFAULT),
    "aten.maximum.default": ((0, 1), _DEFAULT),
    "aten.where.self": ((1, 2), _DEFAULT),
    "aten.pow.Tensor_Tensor": ((0, 1), _DEFAULT),
}
_FLOATS = ("float16", "bfloat16", "float32", "float64")


def promote_operands(captured, precision: str | None):
    """Insert the casts of ``captured.graph_module``'s mixed-dtype elementwise ops in place (see
    the module docstring); returns ``captured``."""
    import torch
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    from torchfl.hcd.dtypes import short_dtype
    from torchfl.kernels.elementwise import INTS, PROMOTE

    def on_chip(dt: str) -> str:
        return precision if precision and dt in _FLOATS else dt

    gm = captured.graph_module
    changed = False
    for node in list(gm.graph.nodes):
        spec = OPERANDS.get(str(node.target)) if node.op == "call_function" else None
        if spec is None:
            continue
        positions, kind = spec
        args = [node.args[i] for i in positions if i < len(node.args)]
        vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in args]
        if not all(isinstance(v, (torch.Tensor, bool, int, float)) for v in vals):
            continue
        operands = [(i, a) for i, a, v in zip(positions, args, vals) if isinstance(v, torch.Tensor)]
        _compute, target = elementwise_dtypes(*vals, type_promotion_kind=getattr(ELEMENTWISE_TYPE_PROMOTION_KIND, kind))
        want = on_chip(short_dtype(target))
        if all(on_chip(short_dtype(a.meta["val"].dtype)) == want for _i, a in operands):
            continue
        op_name = str(node.target).split(".")[1]
        for i, a in operands:
            have = on_chip(short_dtype(a.meta["val"].dtype))
            if have == want:
                continue
            if i == positions[1] and op_name in PROMOTE and have in INTS and want in _FLOATS:
                continue     # the kernel converts an integer second operand on load: no step
            node.update_arg(i, _cast(gm.graph, a, target, node))
            changed = True
    if changed:
        gm.recompile()
    return captured


def _cast(graph, value, dtype, before):
    """``aten._to_copy(value, dtype=dtype)`` inserted before ``before``, with its meta value."""
    import torch

    val = value.meta["val"]
    with graph.inserting_before(before):
        node = graph.create_node("call_function", torch.ops.aten._to_copy.default, (value,), {"dtype": dtype},
                                 name=f"{value.name}_as_{str(dtype).split('.')[-1]}")
    node.meta["val"] = torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=dtype, device="meta")
    return node
