"""Index family: copies addressed by index tensors or strides (pure Python part).

- ``index``: advanced indexing ``x[i0, i1, ...]`` (``aten.index.Tensor``) with int32/int64
  index tensors on any dims of x (inputs ``i0``.. ``i5`` by the dim they index; an absent
  one is a ``:``), broadcast together as torch does: adjacent indexed dims put the
  broadcast shape in their place, separated ones put it first. Negative indices count
  from the end. This is the padding-mask lookup of every Hugging Face model
  (``mask[batch_idx, kv_idx]``, a bool x).
- ``gather``: ``torch.gather(x, dim, index)``; ``index_select``: whole slices along dim;
- ``as_strided``: the window ``size``/``stride``/``storage_offset`` over x's row-major
  elements (x as a contiguous tensor, as capture gives it).
- ``index_put``: the scatter ``x[i0, i1, ...] = values`` (or ``+=`` with ``accumulate``),
  ``aten.index_put`` / ``aten._index_put_impl``: the same addresses as ``index``, written
  instead of read (module ``put``: its own tiling).

Every output element reads one element of x at an address the chip's address generator
computes from the indices: one body, one tiling. Out-of-range indices are an error that
names the index and its position, as torch raises.

Tiling (``index_tiling``): the output streams in double-buffered tiles of whole elements
(``stream_plan``); each element reads one gathered element of x (no reuse assumed: the bytes
must not depend on the data). Index tensors smaller than the output (broadcast, or
index_select's list) stay resident when they fit half the cache, else stream beside the
output at one index per element.
"""
from __future__ import annotations

from dataclasses import replace

from ..dtypes import DTYPES, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _n
from ..tiling import stream_plan

ALL = tuple(DTYPES)
MAXIDX = 6
IDX = tuple(f"i{d}?" for d in range(MAXIDX))
IDS = ("int32", "int64")


def index_names(p):
    """The index inputs of a call (in the order of the dims they index)."""
    if p.kernel in ("index", "index_put"):
        return [f"i{d}" for d in range(MAXIDX) if f"i{d}" in p.shapes]
    return ["index"] if p.kernel in ("gather", "index_select") else []


def index_dims(p):
    return [int(n[1:]) for n in index_names(p)] if p.kernel in ("index", "index_put") else []


def _dim(p):
    r = len(p.shapes["x"])
    d = p.attrs["dim"]
    if not -max(r, 1) <= d < max(r, 1):
        raise KernelError(f"{p.kernel}: dim {d} out of range for x of rank {r}")
    return d % r if r else 0


def out_shape(p):
    from ..elementwise import broadcast_shape

    xs, k = tuple(p.shapes["x"]), p.kernel
    if k in ("index", "index_put"):     # index_put: the shape of the addressed elements
        dims = index_dims(p)
        B = broadcast_shape([p.shapes[f"i{d}"] for d in dims], "index")
        if dims == list(range(dims[0], dims[-1] + 1)):
            return xs[:dims[0]] + B + xs[dims[-1] + 1:]
        return B + tuple(s for d, s in enumerate(xs) if d not in dims)
    if k == "gather":
        return tuple(p.shapes["index"])
    if k == "index_select":
        d = _dim(p)
        return xs[:d] + (_n(p.shapes["index"]),) + xs[d + 1:] if xs else ()   # a 0-d x stays 0-d
    return tuple(int(v) for v in p.attrs["size"])


def _check(p):
    xs, k = p.shapes["x"], p.kernel
    for n in index_names(p):
        if p.dtype_of(n) not in IDS:
            raise KernelError(f"{k}: index {n} must be int32 or int64, got {p.dtype_of(n)} (a bool mask index "
                              "has a data-dependent shape: no kernel)")
    if k in ("index", "index_put"):
        dims = index_dims(p)
        if not dims:
            raise KernelError(f"{k}: at least one index tensor (i0..i5) is required")
        if dims[-1] >= len(xs):
            raise KernelError(f"{k}: too many indices for x of rank {len(xs)} (index on dim {dims[-1]})")
    elif k == "gather":
        d, ix = _dim(p), p.shapes["index"]
        if len(ix) != len(xs) and _n(ix):
            raise KernelError(f"gather: index {list(ix)} must have the rank of x {list(xs)}")
        if _n(ix) and any(ix[j] > xs[j] for j in range(len(xs)) if j != d):
            raise KernelError(f"gather: index {list(ix)} is larger than x {list(xs)} outside dim {d}")
    elif k == "index_select":
        _dim(p)
        if len(p.shapes["index"]) > 1:
            raise KernelError(f"index_select: index must be 1-D, got {list(p.shapes['index'])}")
    else:
        size, stride, off = p.attrs["size"], p.attrs["stride"], p.attrs["storage_offset"] or 0
        if len(size) != len(stride) or any(s < 0 for s in size) or any(s < 0 for s in stride) or off < 0:
            raise KernelError(f"as_strided: size {list(size)} and stride {list(stride)} must have one length, "
                              f"non-negative entries; storage_offset {off} >= 0")
        last = off + sum((a - 1) * b for a, b in zip(size, stride)) if _n(size) else -1
        if last >= _n(xs):
            raise KernelError(f"as_strided: the window reaches element {last} of x, which has {_n(xs)} "
                              f"(size {list(size)}, stride {list(stride)}, offset {off})")
    out_shape(p)


def _meta(p):
    return [TensorMeta(out_shape(p), p.dtype_of("x"), None)]


def index_tiling(p, chip):
    """THE tiling function of the index family (see the module docstring)."""
    n = _n(out_shape(p))
    es = ITEMSIZE[p.dtype_of("x")]
    names = index_names(p)
    small = [nm for nm in names if _n(p.shapes[nm]) < n]
    small_bytes = sum(_n(p.shapes[nm]) * ITEMSIZE[p.dtype_of(nm)] for nm in small)
    keep = bool(small) and small_bytes <= chip.cache_bytes // 2
    mask, resident, per_in = 0, 0, es
    for i, nm in enumerate(names):
        if keep and nm in small:
            mask |= 1 << i
            resident += _n(p.shapes[nm]) * ITEMSIZE[p.dtype_of(nm)]
        else:
            per_in += ITEMSIZE[p.dtype_of(nm)]
    plan = stream_plan(p.kernel, p.key, n, per_in, es, len(names), chip, resident_bytes=resident,
                       unit_name="elements",
                       notes=f"gather of one element of x per output element; {len(names)} index input(s)")
    if plan is None:
        raise KernelError(f"{p.kernel}: not even one element fits the {chip.cache_bytes} B cache of {chip.name}")
    return replace(plan, config=replace(plan.config, tiles=plan.config.tiles + (("resident_mask", mask),)))


def _spec(name, inputs, attrs, doc):
    return KernelSpec(name=name, family="index", inputs=inputs, attrs=attrs, dtypes=ALL, layouts="any",
                      doc=doc, check=_check, meta=_meta, tiler=index_tiling, impl="run_index",
                      mixed_dtypes=True, dtype_input="x")


from .put import PUT_SPEC  # noqa: E402  (uses the helpers above)

KERNELS = [
    _spec("index", ("x",) + IDX, {}, "x[i0, i1, ...]: advanced indexing by int index tensors on the dims "
          "they are named after (broadcast together; negative indices from the end)"),
    _spec("gather", ("x", "index"), {"dim": 0}, "torch.gather: out[...] = x[..., index[...], ...] along dim"),
    _spec("index_select", ("x", "index"), {"dim": 0}, "the slices of x at a 1-D index along dim"),
    _spec("as_strided", ("x",), {"size": (), "stride": (), "storage_offset": None},
          "the strided window over x's row-major elements"),
    PUT_SPEC,
]
