"""Layout family: layout_transform (any permutation to any), copy, reshape (metadata
only for row-major tensors: zero bytes), concat, slice, split (several slices along one
dim, one output each: GPT-2's fused q/k/v projection), expand.

One tiling (``plan_layout``): the output is written in its physical order in tiles of
whole elements; each output element reads one input element (a strided DMA gather), so
reads = output elements x itemsize (expand: the input once when it fits half the cache),
writes = output bytes. ``reshape`` of a row-major tensor moves nothing (``metadata``).
"""
from __future__ import annotations

from ..dtypes import DTYPES, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _n
from ..tiling import TileConfig, make_plan, stream_plan

ALL = tuple(DTYPES)
#: inputs of one concat (core 1.27.0: 32; 8 before, and a concat of more fell back whole): the tiling
#: reads only the output's size, so the count changes no price but each input's own bytes
MAXCAT = 32
CAT_IN = ("x0", "x1") + tuple(f"x{i}?" for i in range(2, MAXCAT))


def _check_layout(kernel, lay, rank):
    if lay is None:
        return
    from ..tensor import layout_perm

    try:
        layout_perm(lay, rank)
    except ValueError as e:
        raise KernelError(f"{kernel}: {e}") from None


def reshape_target(src, shape, kernel="reshape"):
    shape = list(shape)
    if shape.count(-1) > 1:
        raise KernelError(f"{kernel}: at most one -1 in shape {shape}")
    known = _n([s for s in shape if s != -1])
    total = _n(src)
    if -1 in shape:
        if known == 0 or total % known:
            raise KernelError(f"{kernel}: cannot infer -1 in {shape} for {total} elements")
        shape[shape.index(-1)] = total // known
    if _n(shape) != total:
        raise KernelError(f"{kernel}: shape {shape} has {_n(shape)} elements, the input {list(src)} has {total}")
    return tuple(shape)


def concat_parts(shapes):
    """The inputs torch.cat really joins: a 1-D empty tensor (shape ``[0]``) beside tensors of
    another shape is skipped, as torch does (Hugging Face's caches start from one). Returns the
    shapes of the inputs that count (all of them when every one is ``[0]``)."""
    kept = [t for t in shapes if tuple(t) != (0,)]
    return kept or list(shapes)


def _dim(d, rank, kernel):
    if not -rank <= d < max(rank, 1):
        raise KernelError(f"{kernel}: dim {d} out of range for rank {rank}")
    return d % rank if rank else 0


def _slice_len(n, start, end, step):
    return len(range(*slice(start, end, step).indices(n)))


def out_meta(p):
    k, s, a = p.kernel, p.shapes, p.attrs
    x = s.get("x")
    lay = p.layouts.get("x")
    if k == "layout_transform":
        return [TensorMeta(x, p.dtype, a["layout"])]
    if k == "copy":
        return [TensorMeta(x, p.dtype, a["out_layout"] if a["out_layout"] is not None else lay)]
    if k == "reshape":
        return [TensorMeta(reshape_target(x, a["shape"]), p.dtype, None)]
    if k == "slice":
        d = _dim(a["dim"], len(x), k)
        shp = list(x)
        shp[d] = _slice_len(x[d], a["start"], a["end"], a["step"])
        return [TensorMeta(tuple(shp), p.dtype, lay)]
    if k == "split":
        d = _dim(a["dim"], len(x), k)
        sizes = [int(v) for v in a["sizes"]]
        if not sizes or any(v < 0 for v in sizes) or sum(sizes) != x[d]:
            raise KernelError(f"split: sizes {sizes} must be non-negative and add up to {x[d]}, the size of "
                              f"dim {d} of the input {list(x)}")
        return [TensorMeta(tuple(v if i == d else n for i, n in enumerate(x)), p.dtype, lay) for v in sizes]
    if k == "expand":
        tgt = list(a["shape"])
        pad = len(tgt) - len(x)
        if pad < 0:
            raise KernelError(f"expand: shape {tgt} has fewer dims than the input {list(x)}")
        xs = (1,) * pad + tuple(x)
        out = []
        for i, (t, n) in enumerate(zip(tgt, xs)):
            t = n if t == -1 else t
            if n != 1 and t != n:
                raise KernelError(f"expand: cannot expand size {n} to {t} at dim {i}")
            out.append(t)
        return [TensorMeta(tuple(out), p.dtype, lay if pad == 0 else None)]
    if k == "concat":
        xs = concat_parts([s[f"x{i}"] for i in range(MAXCAT) if f"x{i}" in s])
        r = len(xs[0])
        d = _dim(a["dim"], r, k)
        for i, t in enumerate(xs):
            if len(t) != r or any(t[j] != xs[0][j] for j in range(r) if j != d):
                raise KernelError(f"concat: input x{i} {list(t)} does not match x0 {list(xs[0])} outside dim {d}")
        shp = list(xs[0])
        shp[d] = sum(t[d] for t in xs)
        return [TensorMeta(tuple(shp), p.dtype, p.layouts.get("x0"))]
    raise AssertionError(k)


def _check(p):
    a = p.attrs
    if p.kernel == "layout_transform":
        _check_layout(p.kernel, a["layout"], len(p.shapes["x"]))
    if p.kernel == "copy":
        _check_layout(p.kernel, a["out_layout"], len(p.shapes["x"]))
    if p.kernel == "slice" and a["step"] <= 0:
        raise KernelError(f"slice: step must be positive, got {a['step']}")
    out_meta(p)


def plan_layout(p, chip):
    """THE tiling function of the layout family (see the module docstring)."""
    es = ITEMSIZE[p.dtype]
    n = sum(_n(m.shape) for m in out_meta(p))
    if p.kernel == "reshape" and p.layouts.get("x") is None:
        cfg = TileConfig("metadata", (), False, "row-major reshape: a new view, no bytes move")
        return make_plan(p.kernel, p.key, cfg, (), 0)
    resident = 0
    per_in = es
    if p.kernel == "expand":
        xin = _n(p.shapes["x"]) * es
        if xin <= chip.cache_bytes // 2 and _n(p.shapes["x"]) < n:
            resident, per_in = xin, 0
    plan = stream_plan(p.kernel, p.key, n, per_in, es, 0, chip, resident_bytes=resident, unit_name="elements")
    if plan is None:
        raise KernelError(f"{p.kernel}: no tile fits the {chip.cache_bytes} B cache of {chip.name}")
    return plan


def _spec(name, inputs, attrs, fuses, doc):
    return KernelSpec(name=name, family="layout", inputs=inputs, attrs=attrs, dtypes=ALL, layouts="any",
                      fuses=(), doc=doc, check=_check, meta=out_meta, tiler=plan_layout, impl="run_layout")


KERNELS = [
    _spec("layout_transform", ("x",), {"layout": None}, (), "store x in another layout (any permutation to any)"),
    _spec("copy", ("x",), {"out_layout": None}, ("aten.clone", "aten.contiguous"), "clone (optionally re-laid out)"),
    _spec("reshape", ("x",), {"shape": ()}, ("aten.view", "aten.reshape"),
          "new shape; zero bytes for a row-major input, else a gathering copy"),
    _spec("concat", CAT_IN, {"dim": 0}, ("aten.cat",), f"concatenate up to {MAXCAT} tensors along dim"),
    _spec("slice", ("x",), {"dim": 0, "start": 0, "end": None, "step": 1}, ("aten.slice",), "x[start:end:step] on dim"),
    _spec("split", ("x",), {"dim": 0, "sizes": ()}, ("aten.split_with_sizes",),
          "x cut along dim into pieces of the given sizes, one output each"),
    _spec("expand", ("x",), {"shape": ()}, ("aten.expand",), "broadcast x to shape (materialised)"),
]
