"""Kept parameters: an npu parameter's buffer frozen for the kernels' derived copies.

A kernel may keep a host copy derived from a frozen buffer (``kernels/frozen.py``): a conv's
float32 weight panels, a GEMM's packed B. The direct path (``direct.py``) keeps every
parameter it hands a kernel (and views of one, ``w.t()``), so an eager forward packs each
weight once, not on every call (ResNet-50 b1 re-packed ~25 MB of weights per forward). The
promise holds while the parameter's identity and version counter are the ones it was frozen
with (:func:`keep`): an optimizer step, ``copy_``, a write through a view and
``load_state_dict`` bump the version, and the next call re-derives. A write through another
tensor over the same storage (``p.data.mul_``: its own version counter) reaches
``host.write_back``, which calls :func:`forget`; a copy into it (``p.data.copy_(w)``,
``load_state_dict`` of a ``.data`` alias), which the adapter runs in C++, calls
:func:`forget_address` first (the adapter is told the kept storages: ``set_kept``). Imports
nothing heavy (host and routes load it at registration).
"""
from __future__ import annotations

import weakref

import torch

from torchfl.kernels.frozen import freeze, thaw

from . import device as _dev

__all__ = ["is_parameter", "keep", "forget", "forget_address"]

_KEPT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # buffer -> (parameter id, version)
_LIVE = _dev.DEVICES.live
_GENERATION: dict = {}     # storage address -> writes through another tensor seen while kept
_PARAM = torch.nn.Parameter


def is_parameter(t) -> bool:
    """A parameter or a view of one: what the routes' keys call a weight."""
    return isinstance(t, _PARAM) or isinstance(t._base, _PARAM)


def keep(t, buf) -> None:
    """Keep parameter ``t``'s buffer ``buf`` frozen, re-frozen (its derived copies dropped)
    whenever ``t``'s identity or version counter moved since it was last frozen."""
    base = t._base
    ident = (id(t if base is None else base), t._version)
    if _KEPT.get(buf) != ident:
        thaw(buf)
        freeze(buf)
        if buf not in _KEPT:
            _adapter().set_kept(buf.address, True)
        _KEPT[buf] = ident


def forget(t) -> None:
    """``t``'s storage is about to be written: drop what kernels derived from it."""
    address = t.untyped_storage().data_ptr()
    buf = _LIVE.get(address)
    if buf is not None and buf in _KEPT:
        forget_address(address)


def generation(address: int) -> int:
    """How many writes through another tensor the storage at ``address`` has had while kept:
    part of lazy mode's static-input key (``executor._identity``), which a version counter
    alone misses (``p.data`` has its own)."""
    return _GENERATION.get(address, 0)


def forget_address(address: int) -> None:
    """The storage at ``address`` is about to be written (the adapter's copy calls this for a
    kept one): its buffer is no longer kept; the next call freezes it afresh."""
    _GENERATION[address] = _GENERATION.get(address, 0) + 1
    buf = _LIVE.get(address)
    if buf is not None and buf in _KEPT:
        del _KEPT[buf]
        thaw(buf)
        _adapter().set_kept(address, False)
    else:       # a kept storage freed since, its address reused: the adapter forgets it
        _adapter().set_kept(address, False)


def _adapter():
    from . import _STATE

    return _STATE["adapter"]
