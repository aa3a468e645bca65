"""Window geometry shared by convolution and pooling (pure Python, no numba/torch).

Both families tile their output along H and W; an output tile ``[o0, o1)`` along one
axis needs the input range ``[lo, hi)`` of that axis (``lo`` may be negative and ``hi``
past the end: that part is padding, zero-filled on chip and never read off-chip). The
tiling function (prediction) and the kernel (execution) both take their ranges from
here, so the bytes they count cannot disagree.
"""
from __future__ import annotations

from ..errors import KernelError

__all__ = ["pair", "conv_out_size", "pool_out_size", "window_span", "adaptive_span",
           "tile_starts", "clipped", "layout_strides", "check_layout"]


def pair(v, name: str, kernel: str, allow_none: bool = False):
    """An int or 1-/2-sequence of ints as an (h, w) pair (None kept when allowed), or KernelError."""
    if v is None and allow_none:
        return None
    if isinstance(v, int):
        v = (v, v)
    v = tuple(v)
    if len(v) == 1:
        v = (v[0], v[0])
    if len(v) != 2 or not all(isinstance(i, int) for i in v):
        raise KernelError(f"kernel {kernel}: {name} must be an int or a pair of ints, got {v!r}")
    return v


def conv_out_size(n: int, k: int, stride: int, pad: int, dil: int) -> int:
    """Output length of a convolution axis (torch's formula; 0 when the window is larger)."""
    span = dil * (k - 1) + 1
    return max(0, (n + 2 * pad - span) // stride + 1)


def pool_out_size(n: int, k: int, stride: int, pad: int, dil: int, ceil_mode: bool) -> int:
    """Output length of a pooling axis, torch's rule: with ``ceil_mode`` the last window
    must start inside the input or the left padding."""
    span = dil * (k - 1) + 1
    num = n + 2 * pad - span + (stride - 1 if ceil_mode else 0)
    out = num // stride + 1          # floor division, as torch's div_rtn: a window wider than
    if ceil_mode and (out - 1) * stride >= n + pad:   # the input still gives one output with
        out -= 1                     # ceil_mode (EfficientNet's pooler), none without
    return max(out, 0)


def window_span(o0: int, o1: int, stride: int, pad: int, dil: int, k: int) -> tuple[int, int]:
    """Input range ``[lo, hi)`` (padding included) covered by outputs ``[o0, o1)``."""
    lo = o0 * stride - pad
    hi = (o1 - 1) * stride - pad + (k - 1) * dil + 1
    return lo, hi


def adaptive_span(o0: int, o1: int, n_in: int, n_out: int) -> tuple[int, int]:
    """Input range of adaptive pooling outputs ``[o0, o1)`` (torch's start/end rule)."""
    return (o0 * n_in) // n_out, -(-(o1 * n_in) // n_out)


def tile_starts(n: int, t: int) -> list[tuple[int, int]]:
    """Tiles ``[a, b)`` of ``range(n)`` with size ``t`` (last one shorter)."""
    t = max(1, int(t))
    return [(a, min(n, a + t)) for a in range(0, n, t)]


def clipped(lo: int, hi: int, n: int) -> int:
    """How many of ``[lo, hi)`` lie inside ``[0, n)``: the elements read off-chip."""
    return max(0, min(hi, n) - max(lo, 0))


def check_layout(layout: str, logical: str = "NCHW") -> str:
    """Validate a layout: a permutation of the logical dimension letters."""
    if not isinstance(layout, str) or sorted(layout) != sorted(logical):
        raise ValueError(f"layout {layout!r} is not a permutation of {logical!r}; "
                         f"write the {len(logical)} letters {logical} in storage order, "
                         f"e.g. {logical!r} or {logical[0] + logical[2:] + logical[1]!r}")
    return layout


def layout_strides(shape: tuple[int, ...], layout: str, logical: str = "NCHW") -> tuple[int, ...]:
    """Element strides, in logical-dimension order, of a dense tensor stored in ``layout``
    (``layout`` lists the dims outermost first: NHWC has C innermost)."""
    check_layout(layout, logical)
    size = dict(zip(logical, shape))
    stride, acc = {}, 1
    for letter in reversed(layout):
        stride[letter] = acc
        acc *= size[letter]
    return tuple(stride[d] for d in logical)


def pow2_candidates(n: int) -> list[int]:
    """Tile sizes tried along an axis of length ``n``: powers of two below it, and ``n``."""
    out, p = [], 1
    while p < n:
        out.append(p)
        p *= 2
    out.append(max(1, n))
    return out


def conv_geometry(p) -> dict:
    """All sizes of a conv problem (forward or backward), validated."""
    k = p.kernel
    a = p.attrs
    stride = pair(a["stride"], "stride", k)
    pad = pair(a["padding"], "padding", k)
    dil = pair(a["dilation"], "dilation", k)
    g = a["groups"]
    if min(stride) < 1 or min(dil) < 1 or min(pad) < 0 or not isinstance(g, int) or g < 1:
        raise KernelError(f"kernel {k}: stride and dilation must be >= 1, padding >= 0, groups a "
                          f"positive int (got stride={stride}, padding={pad}, dilation={dil}, "
                          f"groups={g})")
    wshape = tuple(p.shapes["weight"] if "weight" in p.shapes else (a.get("weight_shape") or ()))
    if len(wshape) != 4:
        raise KernelError(f"kernel {k}: weight must be 4-D (K, C/groups, R, S), got {wshape}")
    K, Cg, R, S = wshape
    if "x" in p.shapes:
        xshape = p.shapes["x"]
    else:
        xshape = tuple(a["input_shape"] or ())
    if len(xshape) != 4:
        raise KernelError(f"kernel {k}: input must be 4-D (N, C, H, W), got {xshape}; "
                          "a 3-D input needs an explicit batch dimension")
    N, C, H, W = xshape
    if C != Cg * g or K % g:
        raise KernelError(f"kernel {k}: input has {C} channels and weight {wshape} with groups={g}: "
                          f"need C == weight.shape[1]*groups ({Cg}*{g}) and K % groups == 0")
    OH = conv_out_size(H, R, stride[0], pad[0], dil[0])
    OW = conv_out_size(W, S, stride[1], pad[1], dil[1])
    if (OH == 0 or OW == 0) and R * S:
        raise KernelError(f"kernel {k}: the dilated kernel ({dil[0] * (R - 1) + 1} x {dil[1] * (S - 1) + 1}) is "
                          f"larger than the padded input ({H + 2 * pad[0]} x {W + 2 * pad[1]}); torch refuses "
                          "this too: pad the input or use a smaller kernel")
    return dict(N=N, C=C, H=H, W=W, K=K, Cg=Cg, Kg=K // g, R=R, S=S, g=g, sh=stride[0],
                sw=stride[1], ph=pad[0], pw=pad[1], dh=dil[0], dw=dil[1], OH=OH, OW=OW)
