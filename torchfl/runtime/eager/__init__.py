"""The ``npu`` eager device: tensors in the emulated chips' memory, every op planned.

    import torch
    model = model.to("npu:0")                 # one device index per chip (TORCHFL_DEVICES)
    x = torch.randn(1, 3, 224, 224, device="npu:0")
    y = model(x); print(y.device)             # npu:0
    torch.npu.memory_allocated(0)

Pieces: ``adapter.cpp`` (the C++ adapter: allocator, device guard, hooks, copy/view
kernels, the fast path of known op signatures; built by ``build.py``), ``device.py`` (which chip each index is, buffers),
``module.py`` (``torch.npu``), ``ops.py`` (every other op: a one-op plan of the SME, cached
per signature, run by the plan executor), ``lazy.py`` (lazy mode: whole graphs).

Registration is the ``torch.backends`` entry point :func:`autoload`, which ``import torch``
runs: it renames PrivateUse1 to ``npu``, installs ``torch.npu`` and the op fallback, and
loads the adapter if a build exists. It imports neither numba nor the registry, and never
raises (an exception there would break ``import torch`` everywhere). The first use of the
device builds the adapter if needed (:func:`ensure_adapter`).

The accelerator (issue 36): once ``npu`` is registered, ``torch.accelerator.
current_accelerator()`` answers ``npu`` in that process, and libraries that pick "the
accelerator" pick the emulated chip. That is the device's purpose (``model.to(device)``
unchanged, as with any out-of-tree backend) and it must exist before the process's first
backward (the autograd engine sizes its device queues once), so registration stays at
``import torch``. The way out, per process: ``TORCHFL_NPU=0`` skips torchfl's registration
(``torch.compile(backend="torchfl")`` and the CLI need no device and work as before);
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` is torch's switch for every autoloaded backend. A
program may still call :func:`register` itself after either.
"""
from __future__ import annotations

import logging
import threading

__all__ = ["autoload", "register", "adapter", "ensure_adapter", "DEVICE"]

DEVICE = "npu"
LOG = logging.getLogger("torchfl")
_STATE: dict = {"registered": False, "adapter": None, "autoload_error": None, "first_use": None}
_LOCK = threading.RLock()


def autoload() -> None:
    """The ``torch.backends`` entry point: register the device (unless ``TORCHFL_NPU=0``),
    never raise."""
    if not npu_enabled():
        return
    try:
        register()
    except Exception as exc:   # noqa: BLE001 -- must stay: an exception here breaks `import torch` for the
        # whole environment. Not silent: kept in _STATE["autoload_error"], logged (debug), and the
        # first use of the device (``register()`` / ``ensure_adapter()``) raises it again
        _STATE["autoload_error"] = exc
        LOG.debug("torchfl: the npu device was not registered at import: %s", exc)


def npu_enabled() -> bool:
    """False when ``TORCHFL_NPU`` is 0/false/no/off: ``import torch`` then leaves
    PrivateUse1 (and ``torch.accelerator``) alone in this process."""
    import os

    return os.environ.get("TORCHFL_NPU", "").strip().lower() not in ("0", "false", "no", "off")


def register() -> None:
    """Make ``npu`` a torch device in this process (idempotent). Cheap: no build, no numba."""
    with _LOCK:
        if _STATE["registered"]:
            return
        import torch                 # a first `import torch` runs autoload, which registers

        if _STATE["registered"]:
            return
        current = torch._C._get_privateuse1_backend_name()
        if current != DEVICE:
            if current != "privateuseone":
                raise RuntimeError(f"PrivateUse1 is already the {current!r} device in this process (another "
                                   "out-of-tree backend, e.g. torch_npu); torchfl's npu device cannot share it")
            torch.utils.rename_privateuse1_backend(DEVICE)
        from . import module

        if not hasattr(torch, DEVICE):
            torch._register_device_module(DEVICE, module)
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                             for_packed_sequence=False, for_storage=True)
        from . import routing

        routing.install(_dispatcher, _fast_miss)
        from .build import load_cached

        mod = load_cached()
        if mod is not None:
            _init(mod)
        else:
            _install_placeholder_guard(torch)
            _STATE["first_use"] = routing.install_first_use(ensure_adapter)
        from .. import hf_mamba

        hf_mamba.install()       # transformers' Mamba scan on npu tensors: the selective_scan kernel
        _STATE["registered"] = True


def _install_placeholder_guard(torch) -> None:
    """A device guard for ``npu`` until the adapter is built (its own guard replaces it).

    Once PrivateUse1 is renamed, ``torch.accelerator`` treats ``npu`` as the process's
    accelerator, and Dynamo asks it for the current stream at every trace, whatever the
    backend: without a guard that question raises "PyTorch is not linked with support for
    npu devices" and ``torch.compile`` breaks in any process that has not built the adapter.
    Only the guard is registered here, not the PrivateUse1 hooks: torch accepts hooks once
    per process, and the adapter's must be the ones that stay.
    """
    class _PlaceholderGuard(torch._C._acc.DeviceGuard):
        def type_(self):
            return torch._C._autograd.DeviceType.PrivateUse1

    guard = _PlaceholderGuard()
    _STATE["placeholder_guard"] = guard          # torch keeps a borrowed reference
    torch._C._acc.register_python_privateuseone_device_guard(guard)


def _dispatcher():
    """``dispatch.dispatch``, imported at the first op (it loads the planner; registration must not)."""
    from .dispatch import dispatch

    return dispatch


def _fast_miss():
    """``dispatch.dispatch_fast``: the adapter's fast path, on a miss (loaded at the first op)."""
    from .dispatch import dispatch_fast

    return dispatch_fast


def set_fast_bypass(which: int, depth: int) -> None:
    """Tell the adapter this thread's lazy depth (``which`` 0) or optimizer-step depth (1): its
    fast path leaves those calls to the Python router. No adapter yet: nothing to tell (its
    fast path is installed at the first op, which asks again)."""
    mod = _STATE["adapter"]
    if mod is not None and hasattr(mod, "set_bypass"):
        mod.set_bypass(which, depth)


def _flush_lazy() -> None:
    """The adapter's sync point (a copy while lazy mode has ops pending): run them."""
    from .lazy import flush_all

    flush_all()


def _route_functional() -> None:
    """Register the functional overloads the rule packs name (``ops.ensure_functional_routes``)
    at the device's first allocation, before the first op: until then a structured op reaches
    the device as its ``.out`` overload, with an output torch allocated before the op and the
    result copied into it (issue 52 case 4: the process's first ``t + t`` held three tensors'
    memory, not two, and a 4 MiB chip refused a 1.43 MiB ``t``). A failure is left for the
    first op, which calls it again, to raise."""
    try:
        from .ops import ensure_functional_routes

        ensure_functional_routes()
    except Exception as exc:   # noqa: BLE001 - raised again, by the first op
        LOG.debug("torchfl: functional routes not registered yet: %s", exc)


def _init(mod) -> None:
    from torchfl.kernels.errors import DeviceOOMError

    from . import device

    from .kept import forget_address

    device.FIRST_ALLOC[0] = _route_functional
    mod.init(device.malloc, device.free, device.device_count, DeviceOOMError, device.default_layout,
             _flush_lazy)
    mod.set_written_callback(forget_address)
    _STATE["adapter"] = mod
    import sys

    lazy = sys.modules.get(__name__ + ".lazy")
    depth = getattr(getattr(lazy, "_TLS", None), "depth", 0) if lazy is not None else 0
    if depth:                 # lazy mode entered before the adapter loaded (this thread)
        set_fast_bypass(0, depth)


def ensure_adapter():
    """The loaded adapter, building it first if this source has no build yet."""
    mod = _STATE["adapter"]
    if mod is not None:
        return mod
    with _LOCK:
        if _STATE["adapter"] is None:
            register()
            if _STATE["adapter"] is None:
                from .build import build

                first = _STATE.pop("first_use", None)
                if first is not None:
                    first()            # the Python stand-ins for the C++ factories go away
                _init(build())
        return _STATE["adapter"]


adapter = ensure_adapter
