"""Elementwise and activation kernels (forward and backward), pure-Python part.

One tiling for the whole family (``plan_elementwise``): the output is walked in its
physical order in tiles of whole elements (``stream_plan``). Inputs of the output's size
stream beside it (double-buffered); a broadcast input (fewer elements) is loaded once and
kept on chip when all broadcast inputs fit in half the cache, else it streams expanded.
Ops per element are FLOP-equivalents from ``COST`` (transcendentals count several).

Dtypes: floats decode to float32 tiles; the ops in ``INDEX_OPS`` also run on integer and
bool tensors (index math, masks: position ids, padding masks), on int64 tiles with exact
integer arithmetic. Comparisons and logical ops (``BOOL_OUT``) store a bool result;
``fill`` (full_like / zeros_like / ones_like) reads only its input's shape.
"""
from __future__ import annotations

from ..dtypes import DTYPES, FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _numel
from ..tiling import stream_plan

INTS = ("int32", "int64", "bool")   # int8 is the quantised type: its elementwise ops are the q-kernels

# name: (op code, inputs, attrs, cost, fuses, doc)
OPS = {
    "add": (0, ("a", "b?"), {"scalar": 0.0, "alpha": 1.0}, 1, ("aten.add",), "a + alpha*b (b tensor, broadcast, or scalar)"),
    "sub": (1, ("a", "b?"), {"scalar": 0.0, "alpha": 1.0}, 1, ("aten.sub",), "a - alpha*b"),
    "mul": (2, ("a", "b?"), {"scalar": 1.0}, 1, ("aten.mul",), "a * b"),
    "div": (3, ("a", "b?"), {"scalar": 1.0}, 1, ("aten.div",), "a / b"),
    "relu": (4, ("a",), {}, 1, ("aten.relu",), "max(a, 0)"),
    "gelu": (5, ("a",), {"approximate": "none"}, 8, ("aten.gelu",), "gelu, erf (none) or tanh form"),
    "silu": (6, ("a",), {}, 5, ("aten.silu",), "a * sigmoid(a)"),
    "sigmoid": (7, ("a",), {}, 4, ("aten.sigmoid",), "1 / (1 + exp(-a))"),
    "tanh": (8, ("a",), {}, 4, ("aten.tanh",), "tanh(a)"),
    "neg": (9, ("a",), {}, 1, ("aten.neg",), "-a"),
    "rsqrt": (10, ("a",), {}, 2, ("aten.rsqrt",), "1 / sqrt(a)"),
    "pow": (11, ("a", "b?"), {"exponent": 2.0}, 2, ("aten.pow",), "a ** b (tensor) or a ** exponent"),
    "where": (12, ("cond", "a", "b"), {}, 1, ("aten.where",), "cond ? a : b (cond bool; all broadcast)"),
    "relu_backward": (13, ("grad", "x"), {"threshold": 0.0}, 1, ("aten.threshold_backward",),
                      "grad where x > threshold else 0"),
    "gelu_backward": (14, ("grad", "x"), {"approximate": "none"}, 12, ("aten.gelu_backward",), "d gelu"),
    "silu_backward": (15, ("grad", "x"), {}, 8, ("aten.silu_backward",), "d silu"),
    "sigmoid_backward": (16, ("grad", "out"), {}, 3, ("aten.sigmoid_backward",), "grad * out * (1 - out)"),
    "tanh_backward": (17, ("grad", "out"), {}, 3, ("aten.tanh_backward",), "grad * (1 - out^2)"),
    "sin": (18, ("a",), {}, 8, ("aten.sin",), "sin(a)"),
    "cos": (19, ("a",), {}, 8, ("aten.cos",), "cos(a)"),
    "exp": (20, ("a",), {}, 4, ("aten.exp",), "exp(a)"),
    "log": (21, ("a",), {}, 4, ("aten.log",), "log(a): -inf at 0, nan below"),
    "sqrt": (22, ("a",), {}, 2, ("aten.sqrt",), "sqrt(a): nan below 0"),
    "abs": (23, ("a",), {}, 1, ("aten.abs",), "|a|"),
    "erf": (24, ("a",), {}, 6, ("aten.erf",), "erf(a)"),
    "hardtanh": (25, ("a",), {"min_val": -1.0, "max_val": 1.0}, 2, ("aten.hardtanh", "aten.clamp"),
                 "a clamped to [min_val, max_val] (None: unbounded); relu6 = hardtanh(0, 6); nan stays nan"),
    "hardswish": (26, ("a",), {}, 4, ("aten.hardswish",), "a * relu6(a + 3) / 6"),
    "hardsigmoid": (27, ("a",), {}, 3, ("aten.hardsigmoid",), "relu6(a + 3) / 6"),
    "eq": (28, ("a", "b?"), {"scalar": 0.0}, 1, ("aten.eq",), "a == b (bool result)"),
    "ne": (29, ("a", "b?"), {"scalar": 0.0}, 1, ("aten.ne",), "a != b (bool result)"),
    "lt": (30, ("a", "b?"), {"scalar": 0.0}, 1, ("aten.lt",), "a < b (bool result)"),
    "le": (31, ("a", "b?"), {"scalar": 0.0}, 1, ("aten.le",), "a <= b (bool result)"),
    "gt": (32, ("a", "b?"), {"scalar": 0.0}, 1, ("aten.gt",), "a > b (bool result)"),
    "ge": (33, ("a", "b?"), {"scalar": 0.0}, 1, ("aten.ge",), "a >= b (bool result)"),
    "logical_and": (34, ("a", "b"), {}, 1, ("aten.logical_and", "aten.bitwise_and"), "a and b (bool result)"),
    "logical_or": (35, ("a", "b"), {}, 1, ("aten.logical_or", "aten.bitwise_or"), "a or b (bool result)"),
    "logical_not": (36, ("a",), {}, 1, ("aten.logical_not", "aten.bitwise_not"), "not a (bool result)"),
    "fill": (37, ("a",), {"scalar": 0.0, "to": None}, 0, ("aten.full_like", "aten.zeros_like", "aten.ones_like"),
             "a tensor of a's shape (and layout) filled with scalar, in dtype `to` (None: a's); reads nothing"),
    "masked_fill": (38, ("a", "mask"), {"scalar": 0.0, "fill_if": True}, 1,
                    ("aten.masked_fill", "aten.where"),
                    "scalar where mask == fill_if, else a (mask bool, broadcast)"),
    "reciprocal": (39, ("a",), {}, 1, ("aten.reciprocal",), "1 / a"),
    "minimum": (40, ("a", "b"), {}, 1, ("aten.minimum",), "the smaller of a and b; nan if either is nan, a on a tie"),
    "maximum": (41, ("a", "b"), {}, 1, ("aten.maximum",), "the larger of a and b; nan if either is nan, a on a tie"),
}
# ops that also run on integer and bool tensors (index math, masks), on exact int64 tiles
INDEX_OPS = frozenset({"add", "sub", "mul", "neg", "abs", "where", "eq", "ne", "lt", "le", "gt", "ge",
                       "logical_and", "logical_or", "logical_not", "fill", "masked_fill", "hardtanh",
                       "minimum", "maximum"})
BOOL_OUT = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not"})
COND = {"where": "cond", "masked_fill": "mask"}   # the bool input of each op that has one
# float arithmetic whose second operand may be an integer or bool tensor: torch promotes it to
# the float dtype (BLOOM's ALiBi: float slopes * int64 positions, base ** int32 powers); it is
# converted on load
PROMOTE = frozenset({"add", "sub", "mul", "div", "pow"})


def broadcast_shape(shapes, kernel):
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        s = (1,) * (rank - len(s)) + tuple(s)
        for i, (o, n) in enumerate(zip(out, s)):
            if n != o and n != 1 and o != 1:
                raise KernelError(f"{kernel}: shapes {', '.join(str(list(x)) for x in shapes)} do not "
                                  "broadcast (sizes must match or be 1, aligned from the right)")
            if o == 1:
                out[i] = n
    return tuple(out)


def _names(p):
    return [n for n in OPS[p.kernel][1] if n.rstrip("?") in p.shapes]


def _out_shape(p):
    return broadcast_shape([p.shapes[n.rstrip("?")] for n in _names(p)], p.kernel)


def out_dtype(p):
    """The output's storage dtype: bool for comparisons and logical ops, fill's ``to``."""
    if p.kernel in BOOL_OUT:
        return "bool"
    if p.kernel == "fill" and p.attrs.get("to"):
        return p.attrs["to"]
    return p.dtype


def _out_layout(p, shape):
    lay = p.attrs.get("out_layout")
    if lay is not None:
        return lay
    first = OPS[p.kernel][1][0] if p.kernel != "where" else "a"
    if tuple(p.shapes[first]) == shape:
        return p.layouts.get(first)
    return None


def _check(p):
    shape = _out_shape(p)
    for n in _names(p):
        n = n.rstrip("?")
        want = "bool" if COND.get(p.kernel) == n else p.dtype
        promoted = n == "b" and p.kernel in PROMOTE and p.dtype in FLOATS and p.dtype_of(n) in INTS
        if p.dtype_of(n) != want and not promoted:
            raise KernelError(f"{p.kernel}: input {n} must be {want}, got {p.dtype_of(n)}; insert a cast")
    if p.dtype in INTS and p.kernel not in INDEX_OPS:
        raise KernelError(f"{p.kernel} computes in {', '.join(FLOATS)}, not {p.dtype}; cast to a float first")
    if p.dtype in INTS:
        for a in ("scalar", "alpha", "min_val", "max_val"):
            v = p.attrs.get(a)
            if v is not None and float(v) != int(float(v)) and not (p.kernel == "fill" and p.attrs.get("to")):
                raise KernelError(f"{p.kernel}: {a}={v} is not an integer, but the input is {p.dtype} (torch "
                                  "would promote to a float): cast the input to a float first")
    to = p.attrs.get("to")
    if to is not None and to not in DTYPES:
        raise KernelError(f"fill: to={to!r} is not a storage dtype; use one of {', '.join(DTYPES)}")
    if p.attrs.get("approximate", "none") not in ("none", "tanh"):
        raise KernelError(f"{p.kernel}: approximate must be 'none' or 'tanh', got {p.attrs['approximate']!r}")
    lay = p.attrs.get("out_layout")
    if lay is not None:
        from ..tensor import layout_perm

        try:
            layout_perm(lay, len(shape))
        except ValueError as e:
            raise KernelError(f"{p.kernel}: out_layout: {e}") from None


def _meta(p):
    shape = _out_shape(p)
    return [TensorMeta(shape, out_dtype(p), _out_layout(p, shape))]


def plan_elementwise(p, chip):
    """THE tiling function of the elementwise family (see the module docstring)."""
    shape = _out_shape(p)
    n = _numel(shape)
    es_out = ITEMSIZE[out_dtype(p)]
    streamed, resident, mask = 0, 0, 0
    bc = [(i, nm.rstrip("?")) for i, nm in enumerate(_names(p)) if _numel(p.shapes[nm.rstrip("?")]) < n]
    bc_bytes = sum(_numel(p.shapes[nm]) * ITEMSIZE[p.dtype_of(nm)] for _, nm in bc)
    keep = bc_bytes <= chip.cache_bytes // 2
    for i, nm in enumerate(_names(p)):
        nm = nm.rstrip("?")
        es = ITEMSIZE[p.dtype_of(nm)]
        if p.kernel == "fill":      # the shape is all fill reads of its input
            continue
        if keep and any(j == i for j, _ in bc):
            resident += _numel(p.shapes[nm]) * es
            mask |= 1 << i
        else:
            streamed += es
    cost = OPS[p.kernel][3]
    plan = stream_plan(p.kernel, p.key, n, streamed, es_out, cost, chip, resident_bytes=resident,
                       unit_name="elements")
    if plan is None:
        raise KernelError(f"{p.kernel}: not even one element fits the {chip.cache_bytes} B cache of {chip.name}")
    from dataclasses import replace

    cfg = replace(plan.config, tiles=plan.config.tiles + (("resident_mask", mask),))
    return replace(plan, config=cfg)


def _spec(name):
    code, inputs, attrs, cost, fuses, doc = OPS[name]
    return KernelSpec(name=name, family="elementwise", inputs=inputs, attrs={**attrs, "out_layout": None},
                      dtypes=FLOATS + INTS if name in INDEX_OPS else FLOATS, layouts="any", fuses=(), doc=doc,
                      check=_check, meta=_meta, tiler=plan_elementwise, impl="run_elementwise",
                      mixed_dtypes=name in COND or name in PROMOTE,
                      dtype_input="a" if name in COND or name in PROMOTE else None)


# -- int8: quantised add (PT2E's dequantize, dequantize -> add [-> relu] -> quantize) --------
QADD_ATTRS = {"a_scale": 1.0, "a_zero_point": 0, "b_scale": 1.0, "b_zero_point": 0, "out_scale": 1.0,
              "out_zero_point": 0, "out_min": -128, "out_max": 127, "relu": False}


def _check_qadd(p):
    a = p.attrs
    if p.dtype_of("b") != "int8":
        raise KernelError(f"qadd: b must be int8 like a, got {p.dtype_of('b')}")
    if tuple(p.shapes["a"]) != tuple(p.shapes["b"]):
        raise KernelError(f"qadd: a and b must have one shape, got {list(p.shapes['a'])} and {list(p.shapes['b'])}")
    if min(a["a_scale"], a["b_scale"], a["out_scale"]) <= 0:
        raise KernelError(f"qadd: scales must be positive, got a {a['a_scale']}, b {a['b_scale']}, "
                          f"out {a['out_scale']}")
    if not -128 <= a["out_min"] <= a["out_max"] <= 127:
        raise KernelError(f"qadd: out_min/out_max must lie in [-128, 127], got [{a['out_min']}, {a['out_max']}]")
    _check(p)


OPS["qadd"] = (18, ("a", "b"), QADD_ATTRS, 4, (), "int8 a + b requantised: clamp(rne(((a - za) sa + "
               "(b - zb) sb) / s_out) + z_out), optional relu")
KERNELS = [_spec(n) for n in OPS if n != "qadd"] + [KernelSpec(
    name="qadd", family="elementwise", inputs=("a", "b"), attrs={**QADD_ATTRS, "out_layout": None},
    dtypes=("int8",), layouts="any",
    fuses=("quantized_decomposed.dequantize_per_tensor.default", "aten.add.Tensor", "aten.relu.default",
           "quantized_decomposed.quantize_per_tensor.default"),
    doc=OPS["qadd"][5], check=_check_qadd, meta=_meta, tiler=plan_elementwise, impl="run_qadd")]
