"""The plan executor, reading and writing npu tensors in place.

One executor runs one call at a time (its ``_temps``, ``_owners``, cached static values and
bound steps are per executor; issue 52: threads running one route at once): ``run`` holds the
executor's lock. Different routes (other shapes, other ops) run at once in other threads.

Inputs: an npu tensor whose dtype and layout are the ones the plan takes is the kernel's
input as it is (a :class:`DeviceTensor` over the tensor's own buffer). Outputs: each
kernel's output buffer becomes an npu tensor's storage; an output that views an input's
buffer (or another output's) becomes a view of that tensor, so no buffer has two owners.
"""
from __future__ import annotations

import threading

import torch

from torchfl.kernels import dtypes as _dt
from torchfl.kernels.memory import DeviceBuffer
from torchfl.kernels.tensor import DeviceTensor, layout_perm
from torchfl.planner.constraints import tensor_layout
from torchfl.runtime.executor import Executor

from . import device as _dev
from . import kept
from .stats import STATS

__all__ = ["EagerExecutor", "as_device_tensor", "as_npu_tensor"]


class _Borrowed(DeviceBuffer):
    """An npu tensor's buffer as a plan input: the tensor owns it, so the executor's frees
    (after the last reader, by the memory plan) leave it alone."""

    __slots__ = ()

    def free(self):
        pass


def _identity(t):
    """What a static input's cached state is valid for: the tensor (a view's base), its
    version counter, the address of its data and its storage's write generation (a write
    through another tensor over it, ``p.data.copy_``, bumps no version of ``t``: kept.py)."""
    if not isinstance(t, torch.Tensor):
        return id(t)
    base = t._base
    return id(t if base is None else base), t._version, t.data_ptr(), _kept_generation(t)


def _kept_generation(t) -> int:
    """Keep ``t``'s npu storage (its writes reach kept.py) and return its write generation."""
    if t.device.type != "npu":
        return 0
    address = t.untyped_storage().data_ptr()
    buf = _dev.buffer_at(address)
    if buf is not None and kept.is_parameter(t):
        kept.keep(t, buf)
    return kept.generation(address)


def as_device_tensor(x, alignment: int):
    """The npu tensor ``x`` as a DeviceTensor over its own buffer, or None when it is not a
    dense permutation at an aligned address (a view that must be copied first)."""
    base = x.untyped_storage().data_ptr()
    buf = _dev.buffer_at(base)
    if buf is None:
        return None
    layout = None
    if not x.is_contiguous():
        layout = tensor_layout(x)
        if layout is None:
            return None
    offset = x.data_ptr() - base
    if (buf.address + offset) % alignment:
        return None
    borrowed = _Borrowed(buf.memory, None, buf.array, buf.nbytes, 0, buf.address)
    return DeviceTensor(borrowed, tuple(x.shape), layout, _dt.from_torch_dtype(x.dtype), offset)


def layout_strides(v) -> list:
    """The element strides of DeviceTensor ``v``'s logical axes, stored densely in its layout."""
    rank = len(v.shape)
    perm = layout_perm(v.layout, rank)
    phys = v.physical_shape
    strides = [0] * rank
    step = 1
    for i in range(rank - 1, -1, -1):
        strides[perm[i]] = step
        step *= phys[i]
    return strides


def as_npu_tensor(v, index: int, owners: dict):
    """DeviceTensor ``v`` as an npu tensor on device ``index``. ``owners`` maps buffer
    addresses to npu tensors already holding them (the inputs, earlier outputs)."""
    strides = layout_strides(v)
    item = _dt.itemsize(v.dtype)
    offset = v.offset // item
    owner = owners.get(v.buffer.address)
    if owner is not None:
        return owner.as_strided(v.shape, strides, offset)
    from . import adapter

    _dev.adopt(v.buffer)
    t = adapter().wrap(v.buffer.address, v.buffer.nbytes, list(v.shape), strides, offset,
                       _dt.torch_dtype(v.dtype), index)
    owners[v.buffer.address] = t
    return t


class EagerExecutor(Executor):
    """Executes a one-op (or lazily recorded) plan on npu tensors, without copies."""

    keeps_outputs = True
    # A static input may be the caller's own npu buffer, which an optimizer step, ``copy_``
    # or ``add_`` writes in place. Every such write bumps the tensor's version counter
    # (shared by its views), so the cached static values -- and the frozen copies kernels
    # derive from them -- are keyed on the tensor's identity, version and address
    # (:meth:`_static_inputs_key`): a written weight is re-derived on its next use.
    freezes_static = True

    def _static_inputs_key(self, args):
        """The base class's key (identity and version of each static input and lifted
        tensor), with views seen through to their base (a ``w.t()`` made anew per call is
        the same weight) and the data address (``p.data = ...`` swaps storage without a
        version bump)."""
        n = len(args)
        return (tuple([_identity(args[i]) for i in self._static_pos if i < n]),
                tuple([_identity(t) for t in self._lifted_tensors]))

    def release(self):
        from torchfl.kernels.frozen import thaw

        for env in (self._base or (), (self._lifted_vals or {}).values()):
            for v in env:
                if isinstance(v, DeviceTensor) and isinstance(v.buffer, _Borrowed):
                    thaw(v.buffer)      # the caller's buffer: never freed here, its copies dropped
        super().release()

    def __init__(self, plan, chip, index: int, **kwargs):
        super().__init__(plan, chip, **kwargs)
        self.index = index
        self._temps = []
        self._owners = {}
        self._lock = threading.RLock()    # one run at a time (re-entrant: a conversion inside a run)

    def _upload(self, x, layout, dtype):
        if not isinstance(x, torch.Tensor):
            return x
        if dtype and not _dt.stored(dtype):
            # a dtype the chip cannot compute in (float64, complex): bytes on the device, a
            # host value for the plan (its host fallbacks, or the precision policy's link cast)
            return x.cpu()
        if x.device.type == "npu":
            want = dtype or _dt.from_torch_dtype(x.dtype)
            if want == _dt.from_torch_dtype(x.dtype):
                v = as_device_tensor(x, self.chip.alignment)
                if v is not None and v.layout == layout:
                    self._owners[v.buffer.address] = x
                    return v
        STATS["converted_inputs"] += 1
        v = DeviceTensor.from_torch(x, self.memory, layout=layout, dtype=dtype)
        self._temps.append(v)
        return v

    def _download(self, v):
        for i, t in enumerate(self._temps):
            if t.buffer is v.buffer:       # an output that is a converted input: it owns it now
                del self._temps[i]
                break
        return as_npu_tensor(v, self.index, self._owners)

    def run(self, args, record=None):
        with self._lock:
            return self._run_locked(args, record)

    def _run_locked(self, args, record):
        try:
            out = super().run(args, record)
            # host values (a complex fallback's result) come back as npu tensors, like the rest
            return tuple(o.to(f"npu:{self.index}") if isinstance(o, torch.Tensor) and o.device.type != "npu"
                         else o for o in out)
        finally:
            kept = {id(v.buffer) for env in (self._base or (), (self._lifted_vals or {}).values())
                    for v in env if isinstance(v, DeviceTensor)}
            for t in self._temps:       # converted inputs, unless cached as static values
                if id(t.buffer) not in kept and not t.buffer.freed:
                    t.buffer.free()
            self._temps.clear()
            self._owners.clear()
