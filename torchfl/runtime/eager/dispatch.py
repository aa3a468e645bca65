"""The entry from the PrivateUse1 fallback (``routing``): every op on ``npu`` tensors comes
here, and is recorded (lazy mode, :mod:`.lazy`) or run now (:mod:`.ops`). A functional op
whose signature was seen before finds its route by the fast key, inline.
"""
from __future__ import annotations

from .calls import promote_host_scalars
from .lazy import active as _lazy_active, record as _lazy_record
from .ops import fast_key, op_kind, run_eager

__all__ = ["dispatch", "dispatch_fast"]


def dispatch(op, args, kwargs):
    if _lazy_active():
        return _lazy_record(op, *promote_host_scalars(op, args, kwargs))
    if not kwargs and op_kind(op) == "functional":      # the warm path: a known signature
        fast = fast_key(op, args)
        if fast is not None:
            try:
                route = fast[2].fast_routes.get(fast[0])
            except TypeError:       # an unhashable argument: run_eager takes the general key
                route = None
            if route is not None:
                return route.call(args, kwargs, fast[1])
    # off the warm path: a 0-dim CPU operand of another float dtype takes the dtype torch's
    # promotion gives the op (its route is then found by the promoted arguments' key)
    return run_eager(op, *promote_host_scalars(op, args, kwargs))


def dispatch_fast(op, args, kwargs, want):
    """The adapter's fast path missed (``adapter.cpp``, ``FastKernel``): run the call as
    :func:`dispatch` does and, when ``want``, hand back the runner of the route that served it
    (``ChipRoute.fast_runner``) for the adapter to cache under its C++ key. Returns (result,
    runner or None)."""
    result = dispatch(op, args, kwargs)
    if not want or kwargs or _lazy_active():
        return result, None
    fast = fast_key(op, args)
    if fast is None:
        return result, None
    try:
        route = fast[2].fast_routes.get(fast[0])
    except TypeError:       # an unhashable argument: no fast key
        return result, None
    runner = getattr(route, "fast_runner", None)
    return result, (runner() if runner is not None else None)
