"""The entry from the PrivateUse1 fallback (``routing``): every op on ``npu`` tensors comes
here, and is recorded (lazy mode, :mod:`.lazy`) or run now (:mod:`.ops`). A functional op
whose signature was seen before finds its route by the fast key, inline.
"""
from __future__ import annotations

from .lazy import active as _lazy_active, record as _lazy_record
from .ops import fast_key, op_kind, run_eager

__all__ = ["dispatch"]


def dispatch(op, args, kwargs):
    if _lazy_active():
        return _lazy_record(op, args, kwargs)
    if not kwargs and op_kind(op) == "functional":      # the warm path: a known signature
        fast = fast_key(op, args)
        if fast is not None:
            try:
                route = fast[2].fast_routes.get(fast[0])
            except TypeError:       # an unhashable argument: run_eager takes the general key
                route = None
            if route is not None:
                return route.call(args, kwargs, fast[1])
    return run_eager(op, args, kwargs)
