"""1-D convolution as the 2-D kernel with H = 1 (Wav2Vec2's feature encoder and positional
convolution): no kernel code of its own.

A ``conv1d`` call ``x (N, C, L)``, ``weight (K, C/groups, S)`` is the ``conv2d`` call
``x (N, C, 1, L)``, ``weight (K, C/groups, 1, S)`` with stride, padding and dilation
``(1, s)``, ``(0, p)``, ``(1, d)``: the same bytes and operations, so the plan is conv2d's
plan of that call (its tiling, its strategy) and execution runs conv2d on 4-D views of
the same buffers (metadata only). Grouped and depthwise convolutions come with it.
"""
from __future__ import annotations

from dataclasses import replace

from ..dtypes import FLOATS
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta



def _conv2d():
    from ..conv import KERNELS

    return next(k for k in KERNELS if k.name == "conv2d")


def lift_layout(layout, rank=3):
    """A 3-D layout as the 4-D one with H (axis 2) just outside W: (N, C, L) -> (N, C, 1, L)."""
    if layout is None:
        return None
    from ..tensor import layout_perm

    perm = [a if a < 2 else 3 for a in layout_perm(layout, rank)]
    i = perm.index(3)
    return tuple(perm[:i] + [2] + perm[i:])


def drop_layout(layout):
    """Inverse of :func:`lift_layout` on a conv2d output layout."""
    if layout is None:
        return None
    from ..tensor import layout_perm

    return tuple(a if a < 2 else 2 for a in layout_perm(layout, 4) if a != 2)


def as_conv2d(p):
    """The conv2d problem of a conv1d problem."""
    x, w = p.shapes["x"], p.shapes["weight"]
    if len(x) != 3 or len(w) != 3:
        raise KernelError(f"conv1d: x (N, C, L) and weight (K, C/groups, S) must be 3-D, got {list(x)} and {list(w)}")
    a = p.attrs
    for nm in ("stride", "padding", "dilation"):
        if len(a[nm]) != 1:
            raise KernelError(f"conv1d: {nm} must have one entry, got {list(a[nm])}")
    shapes = {"x": (x[0], x[1], 1, x[2]), "weight": (w[0], w[1], 1, w[2])}
    if "bias" in p.shapes:
        shapes["bias"] = tuple(p.shapes["bias"])
    attrs = {"stride": (1, a["stride"][0]), "padding": (0, a["padding"][0]), "dilation": (1, a["dilation"][0]),
             "groups": a["groups"]}
    layouts = {k: lift_layout(v) for k, v in p.layouts.items() if k in ("x", "weight")}
    return _conv2d().problem(shapes, attrs, p.dtype, layouts, {k: p.dtype_of(k) for k in p.shapes})


def _meta(p):
    (m,) = _conv2d().output_meta(as_conv2d(p))
    n, k, _, ol = m.shape
    return [TensorMeta((n, k, ol), m.dtype, drop_layout(m.layout))]


def conv1d_tiling(p, chip):
    """conv2d's tiling of the lifted call (see the module docstring)."""
    plan = _conv2d().tile(as_conv2d(p), chip)
    return replace(plan, kernel=p.kernel, key=p.key)


KERNELS = [
    KernelSpec("conv1d", "conv1d", ("x", "weight", "bias?"),
               {"stride": (1,), "padding": (0,), "dilation": (1,), "groups": 1}, FLOATS, "any",
               ("aten.convolution.default",),
               "1-D convolution (N, C, L), any groups (depthwise): conv2d with H = 1 on views of the same buffers",
               lambda p: as_conv2d(p), _meta, conv1d_tiling, "run_conv1d", mixed_dtypes=True, dtype_input="x"),
]
