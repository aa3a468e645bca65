"""One compile of a kernel specialisation at a time across processes sharing the cache.

The executor and its compile helper (:mod:`precompile`) share one kernel cache. Without
coordination both compiled the same large kernel at the same moment (ResNet-50's first
call: ``conv_tile_fused`` and ``max_pool_tile`` twice each, side by side, ~35 s of a
shared core apiece). Once :func:`install` has run, a process about to compile a cached
jitted function for a signature Numba has no entry for first claims it: a file named
after (function, signature) created exclusively in ``<kernel cache>/.claims``. Whoever
holds the claim compiles (Numba then writes the result to the cache); a process that finds
it held either waits for it to go and loads the result from the cache (``"wait"``: the
executor, which needs the kernel now) or gives up the kernel call (``"skip"``: the helper,
which goes on to its next call; a claim met inside another compile is waited for up to
``NESTED_WAIT_S``, so that a small shared callee does not cost a whole large kernel). A
claim is an exclusive ``flock`` on that file, which the kernel releases when its process
ends, so a dead holder's claim is free at once and a reused pid never looks like the
holder; a claim held past ``MAX_HOLD_S`` (a hung holder) is compiled beside. Functions without a cache (Numba's own
overloads) are compiled as usual, unclaimed.

    compilelock.install("wait")    # idempotent; the mode can be changed by a later call
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
from pathlib import Path

__all__ = ["Claimed", "install", "mode", "NESTED_WAIT_S"]

NESTED_WAIT_S = 5.0
MAX_HOLD_S = 900.0  # the longest kernel compile is ~1 min at full load; a claim older than this is not waited for
_POLL_S = 0.05

_state = {"mode": None, "original": None, "dir": None}
_local = threading.local()       # held claim names (re-entrant) and nesting depth, per thread


class Claimed(RuntimeError):
    """Another process is compiling this kernel specialisation (raised in ``"skip"`` mode)."""


def mode() -> str | None:
    return _state["mode"]


def install(how: str = "wait") -> None:
    """Claim before compiling in this process (``how``: ``"wait"`` or ``"skip"``)."""
    if how not in ("wait", "skip"):
        raise ValueError(f"compilelock mode {how!r}: expected 'wait' or 'skip'")
    from numba.core.dispatcher import Dispatcher

    from .jitcache import writable_dir

    # beside the kernels being written: a read-only cache saves none (claims would only make
    # processes wait for kernels that never arrive), so there claims are off
    cache = writable_dir()
    claims = None if cache is None else cache / ".claims"
    if _state["mode"] == how and _state["dir"] == claims:
        return
    if claims is not None:
        try:
            claims.mkdir(parents=True, exist_ok=True)
        except OSError:
            claims = None
    _state["dir"], _state["mode"] = claims, how
    if _state["original"] is None:
        _state["original"] = Dispatcher.compile
        Dispatcher.compile = _compile


def _name(disp, args) -> str:
    fn = disp.py_func
    # a closure's cell values are part of what it compiles (elementwise's per-op apply), as
    # they are of Numba's cache key
    cells = tuple(c.cell_contents for c in fn.__closure__ or ())
    key = f"{fn.__module__}.{fn.__qualname__}:{fn.__code__.co_firstlineno}{cells if cells else ''}|{args}"
    return hashlib.sha1(key.encode()).hexdigest()[:24]


def _take(path: Path) -> int | None:
    """The claim, as an open descriptor holding an exclusive ``flock`` on its file; None if
    another process holds it.

    The kernel drops the lock when its holder ends however it ends (kill -9, a crash), so
    a claim is never mistaken for live because its pid now names another process (pid
    reuse: the file's pid is only written for people reading the directory). Releasing
    unlinks the file while still locked; a process that opened the old file meanwhile
    finds it unlinked after locking it and tries again on the new one.
    """
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o644)
        except FileNotFoundError:       # the claims directory was removed (a cache cleared)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError:
                return UNCLAIMABLE
            continue
        except OSError:                 # not a file (a directory in its place), no permission
            return UNCLAIMABLE
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if not current:                 # released (unlinked) between our open and lock
            os.close(fd)
            continue
        try:                            # the pid is for people reading the directory only:
            os.ftruncate(fd, 0)         # a full disk (ENOSPC) or a file-size limit (EFBIG)
            os.write(fd, f"{os.getpid()}\n".encode())   # leaves the claim (the lock) as good
        except OSError:
            pass
        return fd


#: what :func:`_take` returns when no claim can be taken at all: compile unclaimed (a duplicate
#: compile at worst), never fail or wait for a claim that cannot exist
UNCLAIMABLE = -1


def _stale(path: Path) -> bool:
    """A claim held longer than ``MAX_HOLD_S``: its holder is alive (the lock is held) but
    hung or stopped; compiling beside it costs a duplicate compile, waiting could cost
    forever."""
    try:
        return time.time() - path.stat().st_mtime > MAX_HOLD_S
    except FileNotFoundError:
        return False


def _acquire(path: Path, disp, args, nested: bool) -> int | None:
    """Take the claim, waiting as the mode says; Claimed when giving up, None when the
    holder has held it past ``MAX_HOLD_S`` (compile unclaimed). A wait is reported as a
    compile of the function (``numba:compile``: progress displays and compile totals count
    it, the kernel is being compiled, on the other core)."""
    fd = _take(path)
    if fd is not None:
        return None if fd == UNCLAIMABLE else fd
    from numba.core import event

    with event.trigger_event("numba:compile", data=dict(dispatcher=disp, args=args, return_type=None)):
        t0 = time.monotonic()
        while True:
            fd = _take(path)
            if fd is not None:
                return None if fd == UNCLAIMABLE else fd
            if _stale(path):
                return None
            if _state["mode"] == "skip" and (not nested or time.monotonic() - t0 > NESTED_WAIT_S):
                raise Claimed(f"{disp.py_func.__qualname__}{args} is being compiled by another process")
            time.sleep(_POLL_S)


def _release(path: Path, fd: int | None) -> None:
    if fd is None:
        return
    try:
        path.unlink(missing_ok=True)    # still locked: a waiter that opened it retries on a new file
    finally:
        os.close(fd)


def _compile(self, sig):
    """Numba's ``Dispatcher.compile`` behind a cross-process claim (see module docstring)."""
    from numba.core import sigutils
    from numba.core.caching import NullCache

    from .jitcache import saving

    original = _state["original"]
    args, _ret = sigutils.normalize_signature(sig)
    if (_state["mode"] is None or _state["dir"] is None or tuple(args) in self.overloads
            or isinstance(self._cache, NullCache) or not saving()):
        # (a cache that saves nothing, a full disk: no other process will find this kernel
        # there, so no one waits for it)
        return original(self, sig)
    held = getattr(_local, "held", None)
    if held is None:
        held = _local.held = set()
    name = _name(self, tuple(args))
    if name in held:                  # a recursive compile of the same specialisation
        return original(self, sig)
    path = _state["dir"] / name
    fd = _acquire(path, self, tuple(args), nested=bool(held))
    held.add(name)
    try:
        return original(self, sig)
    finally:
        held.discard(name)
        _release(path, fd)
