"""The eager warm path: a one-op plan run straight through its bound kernel.

Most one-op plans are one chip step that reads the caller's npu tensors as they are (their
dtype and layout are the plan's) and writes fresh output buffers. For those the executor's
general machinery (slots, memory plan, uploads, static caches, output spec) does nothing a
call needs, and costs more than the routing around it should (issue 19: <= 50 us per op
beyond the kernel). :func:`prepare` checks, once, after the executor's first run (which
bound the kernel to its tile plan and checked it against the plan), that the plan is of
that shape; :class:`DirectRun` then takes the inputs' buffers, calls the same bound kernel
(``KernelSpec.bind``: its per-call signature and alignment checks still run) and wraps the
outputs as npu tensors. Anything unusual on a call (a misaligned view, a buffer torch does
not own) returns None before the kernel runs and the caller takes the executor's path.

Parameters (and views of them) are kept frozen for the kernels' derived copies (``kept.py``).
"""
from __future__ import annotations

import time

from torchfl.kernels import dtypes as _dt
from torchfl.kernels.tensor import DeviceTensor

from . import device as _dev
from .executor import as_device_tensor, as_npu_tensor, layout_strides
from .kept import is_parameter, keep

__all__ = ["DirectRun", "prepare"]

_LIVE = _dev.DEVICES.live     # address -> buffer of each torch npu storage


def prepare(executor, tensors):
    """A :class:`DirectRun` for ``executor``'s plan, or None when the plan needs the executor
    (``Executor.direct_form``: several steps, host steps, weights, conversions, outputs that
    view inputs...) or this call's tensors are not what the kernel reads as they are.
    ``tensors``: the call's flat tensor arguments (the executor has just run on them)."""
    form = executor.direct_form()
    if form is None:
        return None
    inputs = []
    for name, pos, lay, dt in form.inputs:
        if pos >= len(tensors):
            return None
        t = tensors[pos]
        if t.device.type != "npu" or (dt and dt != _dt.from_torch_dtype(t.dtype)):
            return None
        v = as_device_tensor(t, executor.chip.alignment)
        if v is None or v.layout != lay:
            return None
        inputs.append((name, pos, v.shape, v.layout, v.dtype, is_parameter(t)))
    return DirectRun(form.call, tuple(inputs), form.n_out, executor)


class DirectRun:
    """One prepared one-op plan: ``run(tensors)`` -> its outputs as npu tensors, or None
    (nothing ran) when a call's inputs are not as prepared. ``last_kernel_s``: the time in
    the kernel call, as the executor's ``last_kernel_s`` measures it."""

    __slots__ = ("call", "inputs", "n_out", "index", "memory", "align", "wrappers", "metas", "last_kernel_s",
                 "wrap")

    def __init__(self, call, inputs, n_out, executor):
        from . import _STATE

        self.call, self.inputs, self.n_out = call, inputs, n_out
        self.index = executor.index
        self.memory = executor.memory
        self.align = int(executor.chip.alignment)
        self.wrappers: dict = {}        # (shape, layout, dtype) -> (shape list, strides, torch dtype)
        self.metas: dict = {}           # the same -> (shape list, strides, torch dtype, index): run_raw's
        self.last_kernel_s = 0.0
        self.wrap = _STATE["adapter"].wrap

    def run(self, tensors):
        outs = self._kernel(tensors)
        if outs is None:
            return None
        return tuple([self._wrap(o, tensors) for o in outs])

    def run_raw(self, tensors):
        """The adapter's fast path (one output): ``(address, nbytes, meta)`` of a fresh output
        buffer, now owned by torch (the adapter makes the tensor over it; ``meta`` is
        ``(sizes, strides, torch dtype, device index)``, one object per output shape), the
        output as an npu tensor when it views an input, or None (nothing ran)."""
        outs = self._kernel(tensors)
        if outs is None:
            return None
        v = outs[0]
        buf = v.buffer
        address = buf.address
        if v.offset or address in _LIVE:
            owners = {t.untyped_storage().data_ptr(): t for t in tensors}
            return as_npu_tensor(v, self.index, owners)
        key = (v.shape, v.layout, v.dtype)
        meta = self.metas.get(key)
        if meta is None:
            shape, strides, dtype = _wrapper(v)
            meta = self.metas[key] = (shape, strides, dtype, self.index)
        _LIVE[address] = buf
        return address, buf.nbytes, meta

    def _kernel(self, tensors):
        """The bound kernel on ``tensors``' buffers: its named outputs (DeviceTensors), or None
        when an input is not as prepared (nothing ran)."""
        align = self.align
        inputs = {}
        new = DeviceTensor.__new__
        for name, pos, shape, layout, dtype, param in self.inputs:
            t = tensors[pos]
            offset = t.storage_offset() * t.element_size()
            buf = _LIVE.get(t.data_ptr() - offset)
            if buf is None or (buf.address + offset) % align:
                return None
            if param:
                keep(t, buf)
            v = new(DeviceTensor)
            v.buffer, v.shape, v.layout, v.dtype, v.offset = buf, shape, layout, dtype, offset
            inputs[name] = v
        with self.memory.returned_on_error():
            k0 = time.perf_counter()
            outs, _counted = self.call(inputs)
            self.last_kernel_s = time.perf_counter() - k0
        n = self.n_out
        for extra in outs[n:]:          # outputs the plan does not name (as the executor's _store)
            if extra.__class__ is DeviceTensor:
                extra.buffer.free()
        return outs[:n] if len(outs) > n else outs

    def _wrap(self, v, tensors):
        """Output ``v`` as an npu tensor owning its buffer (no copy)."""
        address = v.buffer.address
        if v.offset or address in _LIVE:    # a view into an input's (or another output's) buffer
            owners = {t.untyped_storage().data_ptr(): t for t in tensors}
            return as_npu_tensor(v, self.index, owners)
        key = (v.shape, v.layout, v.dtype)
        w = self.wrappers.get(key)
        if w is None:
            w = self.wrappers[key] = _wrapper(v)
        shape, strides, dtype = w
        _LIVE[address] = v.buffer
        return self.wrap(address, v.buffer.nbytes, shape, strides, 0, dtype, self.index)


def _wrapper(v):
    """Shape, strides and torch dtype of a fresh output in its layout (as_npu_tensor's)."""
    return list(v.shape), layout_strides(v), _dt.torch_dtype(v.dtype)
