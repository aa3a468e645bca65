"""Numba compiles as events a user can be told about.

A kernel's first call in a process with a cold cache (see :mod:`jitcache`) compiles it:
seconds each, a minute or more for a model. Numba broadcasts ``numba:compile`` around
every compile (not around a load from the cache); this module listens once per process and
passes the outermost compile's start and end to subscribers (a progress display, the
runtime's one-time notice), under a label the caller set for what it was running
(``conv2d_bn_relu (float16)``), else the jitted function's name.

    unsubscribe = subscribe(lambda ev: print(ev.label, ev.kind, ev.seconds))
    with labelled("conv2d_bn_relu (float16)"):
        call(inputs)
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["CompileEvent", "subscribe", "displayed", "labelled", "current", "totals"]


@dataclass(frozen=True)
class CompileEvent:
    kind: str          # "start" or "end"
    label: str         # what was running (the caller's label) or the jitted function
    function: str      # module.qualname of the outermost function being compiled
    seconds: float     # "end": the compile's duration; "start": 0


_lock = threading.Lock()
_subscribers: list = []
_local = threading.local()
_installed = False
_state = {"depth": 0, "t0": 0.0, "label": "", "function": "", "count": 0, "seconds": 0.0}


def _function_name(event) -> str:
    disp = (event.data or {}).get("dispatcher")
    fn = getattr(disp, "py_func", None)
    if fn is None:
        return "?"
    return f"{fn.__module__.removeprefix('torchfl.kernels.')}.{fn.__qualname__}"


def _emit(ev: CompileEvent) -> None:
    for fn in list(_subscribers):
        fn(ev)


def _install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        from numba.core import event

        class _Listener(event.Listener):
            # Numba compiles under its global compiler lock: one compile at a time per process
            def on_start(self, ev):
                st = _state
                st["depth"] += 1
                if st["depth"] == 1:
                    st["t0"] = time.perf_counter()
                    st["function"] = _function_name(ev)
                    st["label"] = getattr(_local, "label", None) or st["function"]
                    _emit(CompileEvent("start", st["label"], st["function"], 0.0))

            def on_end(self, ev):
                st = _state
                st["depth"] -= 1
                if st["depth"] == 0:
                    dt = time.perf_counter() - st["t0"]
                    st["count"] += 1
                    st["seconds"] += dt
                    _emit(CompileEvent("end", st["label"], st["function"], dt))

        event.register("numba:compile", _Listener())
        _installed = True


_displays: list = []       # subscribers that show compiles to the user (a progress bar)


def subscribe(fn, *, display: bool = False):
    """Call ``fn(CompileEvent)`` at the start and end of every outermost compile; returns a
    function that unsubscribes. ``display``: ``fn`` shows them to the user (notices that
    would repeat it stay quiet meanwhile, see :func:`displayed`). Imports numba (the listener
    is installed once)."""
    _install()
    _subscribers.append(fn)
    if display:
        _displays.append(fn)

    def unsubscribe():
        for registry in (_subscribers, _displays):
            if fn in registry:
                registry.remove(fn)

    return unsubscribe


def displayed() -> bool:
    """Whether a subscriber is showing compiles to the user right now."""
    return bool(_displays)


@contextmanager
def labelled(label: str):
    """Name what runs inside (compiles it triggers are reported under ``label``)."""
    prev = getattr(_local, "label", None)
    _local.label = label
    try:
        yield
    finally:
        _local.label = prev


def current() -> tuple[str, float] | None:
    """(label, seconds so far) of the compile in progress, None when none is."""
    st = _state
    if st["depth"] <= 0:
        return None
    return st["label"], time.perf_counter() - st["t0"]


def totals() -> tuple[int, float]:
    """(outermost compiles, their seconds) in this process since the listener was installed."""
    return _state["count"], _state["seconds"]
