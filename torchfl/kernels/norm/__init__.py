"""Normalisation family: batch-norm (inference, training, backward) and layer-norm (forward,
backward). Pure Python part: specs, problem checks and the one tiling function.

Both norms work on *segments*: batch-norm's segment is one channel (all N x spatial
elements), layer-norm's one row (the normalised dims). :func:`norm_tiling` picks

- ``resident``: ``TS`` whole segments per tile, double-buffered; each element is read
  once (statistics and normalisation both run on the on-chip copy);
- ``chunked``: a single segment does not fit; it is streamed in chunks of ``TE``
  elements and read once per pass (training statistics, then normalisation: twice).
  Layer norm's row is also chunked when it is longer than the chip's per-core row
  (HCD 1.1 ``execution.row_resident_elements``, ``chip.row_elements``): the core that
  reduces a row cannot keep a longer one between the statistics and the normalisation.

Bytes depend only on the strategy (resident <= chunked), so a bigger cache never moves
more. Operation counts use fixed per-element costs (``_OPS``), the same numbers the
kernels count as they process elements.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from .. import dtypes as _dt
from ..dtypes import FLOATS
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..spec import numel as _prod
from ..tiling import TileConfig, Traffic, make_plan

__all__ = ["KERNELS", "norm_tiling", "segments"]

STAT = 4   # saved statistics (mean, invstd) are float32, as torch keeps them

# per-element ops per pass and per-segment ops (definitions the kernels count by)
_OPS = {
    "batch_norm_infer": ((2,), 4),           # y = x*scale + shift; fold 4/ch
    "batch_norm_train": ((3, 2), 10),        # stats (sub, add, fma) | apply; fold + running
    "batch_norm_backward": ((4, 5), 6),
    "layer_norm": ((3, 4), 4),               # stats | normalise (+ affine)
    "layer_norm_backward": ((9,), 6),
}


def segments(p) -> tuple[int, int]:
    """(number of segments, elements per segment) of a norm problem."""
    x = p.shapes["x"] if "x" in p.shapes else p.shapes["grad_out"]
    if p.kernel.startswith("batch"):
        if len(x) < 2:
            raise KernelError(f"kernel {p.kernel}: input must have a channel dim (N, C, ...), got {x}")
        return x[1], x[0] * _prod(x[2:])
    ns = _norm_shape(p)
    return _prod(x[:len(x) - len(ns)]), _prod(ns)


def _norm_shape(p):
    x = p.shapes["x"]
    ns = p.attrs["normalized_shape"]
    if ns is None:
        ns = x[-1:]
    ns = (ns,) if isinstance(ns, int) else tuple(ns)
    if len(ns) == 0 or len(ns) > len(x) or tuple(x[len(x) - len(ns):]) != ns:
        raise KernelError(f"kernel {p.kernel}: normalized_shape {ns} must be the trailing dims of the "
                          f"input {x}")
    return ns


def _check(p):
    k = p.kernel
    C, _ = segments(p)
    if k.startswith("batch"):
        for n in ("weight", "bias", "running_mean", "running_var", "save_mean", "save_invstd"):
            if n in p.shapes and p.shapes[n] != (C,):
                raise KernelError(f"kernel {k}: {n} must have shape ({C},), got {p.shapes[n]}")
        if k == "batch_norm_train" and segments(p)[1] == 1:
            raise KernelError(f"kernel {k}: expected more than 1 value per channel when training, "
                              f"got input {p.shapes['x']} (as torch.nn.functional.batch_norm)")
        if k == "batch_norm_backward" and p.shapes["grad_out"] != p.shapes["x"]:
            raise KernelError(f"kernel {k}: grad_out {p.shapes['grad_out']} and x {p.shapes['x']} differ")
    else:
        ns = _norm_shape(p)
        for n in ("weight", "bias"):
            if n in p.shapes and p.shapes[n] != ns:
                raise KernelError(f"kernel {k}: {n} must have shape {ns}, got {p.shapes[n]}")
        if k == "layer_norm_backward":
            M, _ = segments(p)
            for n in ("mean", "rstd"):
                if _prod(p.shapes[n]) != M:
                    raise KernelError(f"kernel {k}: {n} must have {M} elements (one per row), "
                                      f"got shape {p.shapes[n]}")
            if p.shapes["grad_out"] != p.shapes["x"]:
                raise KernelError(f"kernel {k}: grad_out {p.shapes['grad_out']} and x differ")
    for n in ("save_mean", "save_invstd", "mean", "rstd"):
        # batch norm's saved statistics may also arrive in the input's dtype: ATen's
        # decomposition returns them so for a bfloat16 / float16 graph, and the backward decodes
        # every statistic to float32 as it loads it
        ok = ("float32", p.dtype) if n.startswith("save_") else ("float32",)
        if n in p.shapes and p.dtype_of(n) not in ok:
            raise KernelError(f"kernel {k}: {n} must be float32 (saved statistics), got {p.dtype_of(n)}")
    odd = {n: p.dtype_of(n) for n in p.shapes
           if n not in ("save_mean", "save_invstd", "mean", "rstd") and p.dtype_of(n) != p.dtype}
    if odd:
        raise KernelError(f"kernel {k}: inputs must all be {p.dtype}, got {odd}; insert a cast")


def _meta(p):
    k, x = p.kernel, p.shapes.get("x")
    lay = p.layouts.get("x")
    C, _ = segments(p)
    if k == "batch_norm_infer":
        # as ATen's _native_batch_norm_legit_no_training: (out, empty save_mean, empty save_invstd)
        return [TensorMeta(x, p.dtype, lay), TensorMeta((0,), "float32"), TensorMeta((0,), "float32")]
    if k == "batch_norm_train":
        # the new running statistics are computed from the float32 batch statistics, so they are
        # float32 whatever the input's dtype: ATen's decomposition (what the graph's metadata
        # says) promotes float32 with the running buffer's dtype; a bfloat16 model's graph then
        # copies them into its bfloat16 buffers
        out = [TensorMeta(x, p.dtype, lay), TensorMeta((C,), "float32"), TensorMeta((C,), "float32")]
        if p.has("running_mean"):
            out.append(TensorMeta((C,), "float32"))
        if p.has("running_var"):
            out.append(TensorMeta((C,), "float32"))
        return out
    if k == "batch_norm_backward":
        out = [TensorMeta(x, p.dtype, lay)]
        if p.attrs["weight_grad"]:
            out += [TensorMeta((C,), p.dtype), TensorMeta((C,), p.dtype)]
        return out
    ns = _norm_shape(p)
    stat = tuple(x[:len(x) - len(ns)]) + (1,) * len(ns)
    if k == "layer_norm":
        return [TensorMeta(x, p.dtype, lay), TensorMeta(stat, "float32"), TensorMeta(stat, "float32")]
    out = [TensorMeta(x, p.dtype, lay)]
    if p.has("weight"):
        out.append(TensorMeta(ns, p.dtype))
    if p.has("bias"):
        out.append(TensorMeta(ns, p.dtype))
    return out


def _streams(p):
    """Bytes per element in/out, per segment in/out, global (resident) in / final out,
    passes over the input in chunked mode."""
    k, es = p.kernel, _dt.itemsize(p.dtype)
    sz = lambda n: _dt.itemsize(p.dtype_of(n)) if p.has(n) else 0  # noqa: E731
    if k == "batch_norm_infer":
        return dict(ie=es, oe=es, is_=sz("weight") + sz("bias") + sz("running_mean") + sz("running_var"),
                    os_=0, glob=0, fin=0, passes=(1,), chunk_in=(es,))
    if k == "batch_norm_train":
        return dict(ie=es, oe=es, is_=sz("weight") + sz("bias") + sz("running_mean") + sz("running_var"),
                    os_=2 * STAT + STAT * (p.has("running_mean") + p.has("running_var")), glob=0, fin=0,
                    passes=(1, 1), chunk_in=(es, es))
    if k == "batch_norm_backward":
        wg = 2 * es if p.attrs["weight_grad"] else 0
        return dict(ie=2 * es, oe=es, is_=sz("weight") + sz("save_mean") + sz("save_invstd"), os_=wg, glob=0, fin=0,
                    passes=(1, 1), chunk_in=(2 * es, 2 * es))
    if k == "layer_norm":
        return dict(ie=es, oe=es, is_=0, os_=2 * STAT, glob=sz("weight") + sz("bias"), fin=0,
                    passes=(1, 1), chunk_in=(es, es))
    return dict(ie=2 * es, oe=es, is_=2 * STAT, os_=0, glob=sz("weight"), fin=sz("weight") + sz("bias"),
                passes=(1,), chunk_in=(2 * es,))


@lru_cache(maxsize=4096)
def _choice(S, L, ie, oe, is_, os_, glob, fin, chunkable, cache, row_limit=0):
    per_seg = L * (ie + oe) + is_ + os_
    # global vectors (layer-norm weight/bias) resident; float32 accumulators for the
    # final gradients (layer-norm backward's grad_weight / grad_bias)
    fixed = glob * L + (STAT * L * 2 if fin else 0)
    if chunkable and row_limit and L > row_limit:
        # one core keeps at most row_limit elements of a row: chunks of at most that many
        per_el = 2 * (ie + oe) + 2 * glob
        te = max(1, min(L, row_limit, (cache - is_ - os_ - 8 * 8) // max(per_el, 1)))
        return "chunked", 1, te, te * per_el + is_ + os_ + 64
    if S * per_seg + fixed <= cache:
        return "resident", S, L, S * per_seg + fixed
    ts = (cache - fixed) // (2 * per_seg) if cache > fixed else 0
    if ts >= 1:
        return "resident", min(S, ts), L, 2 * min(S, ts) * per_seg + fixed
    if not chunkable:
        return "resident", 1, L, 2 * per_seg + fixed   # does not fit: smallest tile, noted
    # chunks of TE elements: 2 buffers per streamed operand, per-segment params + the
    # matching chunk of the global params resident per chunk
    per_el = 2 * (ie + oe) + 2 * glob
    te = max(1, (cache - is_ - os_ - 8 * 8) // max(per_el, 1))
    te = min(te, L)
    return "chunked", 1, te, te * per_el + is_ + os_ + 64


def norm_tiling(p, chip):
    """The normalisation family's one tiling function."""
    S, L = segments(p)
    st = _streams(p)
    k = p.kernel
    if S * L == 0:
        # empty: only per-segment parameters/statistics of empty segments move
        return make_plan(k, p.key, TileConfig("resident", (("segments", S), ("elements", L))), (), 0)
    chunkable = k != "layer_norm_backward"
    row_limit = getattr(chip, "row_elements", 0) if k == "layer_norm" else 0
    strat, ts, te, need = _choice(S, L, st["ie"], st["oe"], st["is_"], st["os_"], st["glob"], st["fin"],
                                  chunkable, chip.cache_bytes, row_limit)
    ope, ops_seg = _OPS[k]
    groups = []
    if strat == "resident":
        per_seg = Traffic(L * st["ie"] + st["is_"], L * st["oe"] + st["os_"], L * sum(ope) + ops_seg)
        full, rest = divmod(S, ts)
        first = Traffic(st["glob"] * L, 0, 0)
        tiles = [ts] * full + ([rest] if rest else [])
        for i, n in enumerate(tiles):
            groups.append((1, per_seg * n + (first if i == 0 else Traffic())))
        if st["fin"]:
            groups.append((1, Traffic(0, st["fin"] * L, 0)))
        cfg = TileConfig("resident", (("segments", ts), ("elements", L)), True,
                         f"{ts} whole segment(s) per tile, read once; footprint {need} B"
                         + ("" if need <= chip.cache_bytes else
                            f" EXCEEDS the {chip.cache_bytes} B cache (one row is too long)"))
    else:
        # per segment: per-segment params once, then each pass streams the chunks
        gl_per_el = st["glob"]
        seg_first = Traffic(st["is_"], 0, ops_seg)
        groups.append((S, seg_first))
        n_full, rest = divmod(L, te)
        for pi, pass_in in enumerate(st["chunk_in"]):
            last = pi == len(st["chunk_in"]) - 1
            for n, cnt in ((te, n_full), (rest, 1 if rest else 0)):
                if not cnt:
                    continue
                t = Traffic(n * (pass_in + (gl_per_el if last else 0)), n * st["oe"] if last else 0,
                            n * ope[pi])
                groups.append((S * cnt, t))
        groups.append((S, Traffic(0, st["os_"], 0)))
        why = (f"a row of {L} exceeds the {row_limit} elements one core keeps (row_resident_elements)"
               if row_limit and L > row_limit else f"a segment of {L} elements does not fit")
        cfg = TileConfig("chunked", (("segments", 1), ("elements", te)), True,
                         f"{why}: {len(st['chunk_in'])} pass(es) over "
                         f"double-buffered chunks of {te}; footprint {need} B")
    plan = make_plan(k, p.key, cfg, groups, need)
    if k == "layer_norm" and getattr(chip, "concurrent_tiles", 0):
        # one row per core on a many-core chip: fewer rows than cores leave cores idle
        plan = replace(plan, config=replace(plan.config, parallel_units=int(S)))
    return plan


KERNELS = [
    KernelSpec("batch_norm_infer", "norm", ("x", "weight?", "bias?", "running_mean", "running_var"),
               {"eps": 1e-5, "momentum": 0.1}, FLOATS, "any",
               ("aten._native_batch_norm_legit_no_training.default",),
               "Inference batch-norm over channel dim 1, any layout/rank (running statistics).",
               _check, _meta, norm_tiling, "run_batch_norm_infer", mixed_dtypes=True),
    KernelSpec("batch_norm_train", "norm", ("x", "weight?", "bias?", "running_mean?", "running_var?"),
               {"eps": 1e-5, "momentum": 0.1}, FLOATS, "any",
               ("aten._native_batch_norm_legit_functional.default",
                "aten._native_batch_norm_legit.default", "aten.native_batch_norm.default"),
               "Training batch-norm: output, saved mean and invstd (float32), updated running "
               "statistics (unbiased variance), like _native_batch_norm_legit_functional.",
               _check, _meta, norm_tiling, "run_batch_norm_train", mixed_dtypes=True),
    KernelSpec("batch_norm_backward", "norm", ("grad_out", "x", "weight?", "save_mean", "save_invstd"),
               {"eps": 1e-5, "train": True, "weight_grad": True}, FLOATS, "any",
               ("aten.native_batch_norm_backward.default",),
               "Batch-norm backward (native_batch_norm_backward): grad_input and, with "
               "weight_grad, grad_weight and grad_bias.",
               _check, _meta, norm_tiling, "run_batch_norm_backward", mixed_dtypes=True),
    KernelSpec("layer_norm", "norm", ("x", "weight?", "bias?"), {"normalized_shape": None, "eps": 1e-5},
               FLOATS, "any", ("aten.native_layer_norm.default", "aten.layer_norm.default"),
               "Layer-norm over the trailing normalized_shape dims: output, mean, rstd "
               "(float32, shape like native_layer_norm).",
               _check, _meta, norm_tiling, "run_layer_norm", mixed_dtypes=True),
    KernelSpec("layer_norm_backward", "norm", ("grad_out", "x", "mean", "rstd", "weight?", "bias?"),
               {"normalized_shape": None, "eps": 1e-5}, FLOATS, "any",
               ("aten.native_layer_norm_backward.default",),
               "Layer-norm backward: grad_input, and grad_weight / grad_bias when weight / bias "
               "are given.", _check, _meta, norm_tiling, "run_layer_norm_backward", mixed_dtypes=True),
]

from .group import KERNELS as _GROUP  # noqa: E402  (group norm: its own module)

KERNELS += _GROUP
