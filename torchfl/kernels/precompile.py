"""Compile kernels in helper processes while this one runs: a cold first call on 2 cores.

Numba compiles on one core holding the GIL, and a model's first call compiles its kernels
one after the other. A helper process given the calls that are still ahead (kernel, input
shapes, storage dtypes, layouts, attributes, which inputs get frozen) calls each kernel once
on scratch inputs of exactly those types, the kernel needed last first, so it compiles the
same specialisations into the shared kernel cache (see :mod:`jitcache`) while this process
compiles from the first on. Both processes claim a specialisation before compiling it
(:mod:`compilelock`): where they meet, the helper skips a call whose kernel this process is
compiling, and this process waits for a kernel the helper is compiling and then loads it
(without claims both compiled the same large kernels side by side). Then the helper compiles
the calls with frozen inputs as later calls make them (a frozen weight takes other kernel
paths). Scratch inputs are uninitialised (types, not values, decide what Numba compiles); a
call that fails in the helper costs nothing, this process compiles it as usual. The helper
imports numpy and numba, never torch.

    prestart()                       # optional, before capture and planning (empty cache only)
    helper = start(chip, calls)      # the helpers as one (Helpers), None if none started
    ...
    helper.wait()                    # optional: the helper exits when done

A helper spends its first ~0.6 s CPU (1-2 s wall on a loaded host) importing numba and the
kernels and setting up Numba's target; started at the first compile, the large kernels it
takes (a BERT layer's GEMM tile, the critical path of its first call) began that much later.
:func:`prestart` starts the helpers when a graph reaches the backend, before capture and
planning, where the cache holds no kernel yet: they import meanwhile and wait for their calls.
"""
from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass

ENV = "TORCHFL_COMPILE_HELPERS"   # how many helpers (0: none; default 2 where there are 2+ CPUs)


@dataclass(frozen=True)
class KernelCall:
    """One kernel call as the executor binds it (the types Numba specialises on)."""

    kernel: str
    impl: str           # family.impl function: kernels sharing one (linear, linear_relu) compile once
    shapes: dict        # input name -> logical shape
    dtypes: dict        # input name -> storage dtype
    layouts: dict       # input name -> layout letters
    attrs: dict
    dtype: str | None   # the problem's dtype (None: the kernel takes mixed dtypes)
    frozen: tuple = ()  # inputs whose buffers the executor freezes after its first call

    @property
    def key(self) -> tuple:
        """Calls with equal keys compile the same code (shapes aside)."""
        return (self.impl, tuple(sorted((self.dtypes[k], len(s)) for k, s in self.shapes.items())),
                tuple(sorted((k, type(v).__name__) for k, v in self.attrs.items())), self.frozen)

    @property
    def ident(self) -> tuple:
        """Equal for calls that are the same in every respect the kernel sees (shapes too:
        they choose kernel paths, a conv's single-tile or tiled driver)."""
        return (self.kernel, self.key, tuple(sorted(self.shapes.items())), tuple(sorted(self.layouts.items())),
                repr(sorted(self.attrs.items())), self.dtype)

    def thawed(self) -> "KernelCall":
        """This call as the executor's first call makes it (nothing frozen yet)."""
        return KernelCall(self.kernel, self.impl, self.shapes, self.dtypes, self.layouts, self.attrs, self.dtype)


def count() -> int:
    """How many helper processes a first call starts: ``$TORCHFL_COMPILE_HELPERS`` (0/off:
    none), else 2 where there are 2+ CPUs. Two, not one, on 2 cores: the executor spends much
    of a cold first call waiting for a kernel a helper holds, and a lone helper compiled the
    large kernels one after the other (BERT layer: GEMM ``_tile`` 9.5 s, then attention 7.3 s,
    the executor idle meanwhile); a second one takes the next call the first holds a claim on."""
    from .envvars import count as env_count

    wanted = env_count(ENV, 2)
    if wanted == 0 or (os.cpu_count() or 1) < 2:
        return 0
    from .jitcache import writable_dir

    if writable_dir() is None:   # a read-only cache and no writable one: a helper's compiles reach no one
        return 0
    return wanted


def enabled() -> bool:
    return count() > 0


def run_calls(chip, calls) -> int:
    """Call each kernel once on scratch inputs (in this process); returns the calls that ran.
    A call that meets a function another process is compiling is tried once more after the
    others: kernels share tasks compiled once (the conv's ``_mm_store``, :mod:`taskcall`), so
    the first call of a family holds the rest back; skipped for good, they were all left to
    the executor, one after the other."""
    from . import frozen
    from .catalog import CATALOG
    from .compilelock import Claimed
    from .memory import DeviceMemory
    from .tensor import DeviceTensor

    done = 0
    for attempt in range(2):
        deferred = []
        for c in calls:
            try:
                spec = CATALOG[c.kernel]
                problem = spec.problem(c.shapes, c.attrs, c.dtype, c.layouts, c.dtypes)
                plan = spec.tile(problem, chip)
                memory = DeviceMemory(chip)
                inputs = {k: DeviceTensor.empty(memory, c.shapes[k], c.dtypes[k], c.layouts.get(k))
                          for k in c.shapes}
                for k in c.frozen:      # kernels take other paths (other specialisations) for these
                    frozen.freeze(inputs[k].buffer)
                spec.bind(chip, problem, plan, memory)(inputs)
                done += 1
            except Claimed:
                deferred.append(c)
            except Exception:  # noqa: BLE001 - a helper's guess: the executor compiles the same call and raises there
                continue
        calls = deferred
    return done


def order(calls, skip=()) -> tuple[list, list]:
    """The helper's work, ``calls`` (in the executor's order) deduplicated (``ident``), none
    in ``skip`` (idents): (for the first call: the call needed last first, so the two
    processes meet in the middle; for later calls: the calls with frozen inputs as the
    executor makes them once it has frozen its static values, in its order). A call whose
    kernels are compiled already only runs (milliseconds on scratch inputs)."""
    seen, first, later = set(), [], []
    for c in calls:
        if c.ident in skip:
            continue
        for todo, v in ((first, c.thawed()), (later, c)):
            if v.ident not in seen:
                seen.add(v.ident)
                todo.append(v)
    return first[::-1], later


def _spawn():
    """A helper process, reading its work from its stdin (None if it cannot start)."""
    try:
        return subprocess.Popen([sys.executable, "-m", "torchfl.kernels.precompile", str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None


_waiting: list = []     # helpers started by prestart(), waiting for their calls
_state = {"prestarted": False, "atexit": False}


def prestart() -> int:
    """Start the helpers now (:func:`count` of them, once per process) if the kernel cache holds
    no kernel yet (:func:`jitcache.holds_kernels`): a first call will compile, and the helpers'
    imports then overlap capture and planning instead of the first compiles. :func:`start` hands
    them their calls; unused, they end with this process. Returns how many were started."""
    if _waiting or _state["prestarted"] or not enabled():
        return 0
    _state["prestarted"] = True
    from .jitcache import holds_kernels

    if holds_kernels():
        return 0
    for _ in range(count()):
        proc = _spawn()
        if proc is None:
            break
        _waiting.append(proc)
    if _waiting:
        _at_exit()
    return len(_waiting)


def _at_exit() -> None:
    if not _state["atexit"]:
        atexit.register(_stop)
        _state["atexit"] = True


def start(chip, calls, skip=()):
    """Helper processes (:func:`count`) compiling ``calls`` (see :func:`order`), as one
    :class:`Helpers`; None if none started. Each takes the calls in the same order; claims
    (:mod:`compilelock`) make one skip what another is compiling, so they split the work.
    ``later``: whether there are calls for after the first call too (the caller lets them
    run on past its first call). Helpers :func:`prestart` started are given the calls first."""
    first, later = order(calls, skip)
    todo = first + later
    if not todo:
        return None
    work = pickle.dumps((chip, todo))
    want, procs = count() or 1, []
    for _ in range(2 * want):
        if len(procs) == want:
            break
        proc = _waiting.pop(0) if _waiting else _spawn()
        if proc is None:
            break
        try:
            proc.stdin.write(work)
            proc.stdin.close()
        except OSError:             # it ended meanwhile (a pre-started one killed): start another
            proc.kill()
            proc.wait()
            continue
        procs.append(proc)
    if not procs:
        return None
    from . import compilelock

    compilelock.install("wait")
    helpers = Helpers(procs, bool(later))
    _at_exit()
    _running.append(helpers)
    return helpers


class Helpers:
    """The helper processes of one first call, handled as one (``subprocess.Popen``'s
    ``poll``/``wait``/``terminate``)."""

    def __init__(self, procs, later: bool):
        self.procs, self.later = procs, later

    def poll(self):
        """None while any helper runs, else the first non-zero exit status (or 0)."""
        codes = [p.poll() for p in self.procs]
        if any(c is None for c in codes):
            return None
        return next((c for c in codes if c), 0)

    def wait(self, timeout=None):
        for p in self.procs:
            p.wait(timeout)
        return self.poll()

    def terminate(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()


_running: list = []


def _stop() -> None:
    """At exit: a helper still compiling for later calls has no later call to serve, and a
    pre-started one that was never given calls has none to wait for."""
    for proc in _running:
        if proc.poll() is None:
            proc.terminate()
    while _waiting:
        proc = _waiting.pop()
        if proc.poll() is None:
            proc.terminate()


def _ready() -> None:
    """In a helper, before its calls arrive: import numba and the kernel modules every call
    needs, claim in ``skip`` mode, and set up Numba's CPU target (its first compile builds
    it: ~0.2 s), so a pre-started helper starts compiling as soon as it is given work."""
    from numba import njit

    from torchfl.kernels import catalog, compilelock, frozen, memory, tensor  # noqa: F401 - imported ahead

    compilelock.install("skip")
    njit(lambda: 0)()


if __name__ == "__main__":
    from torchfl.kernels.lifetime import die_with_parent

    die_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else None)

    _ready()
    _work = sys.stdin.buffer.read()
    if _work:                           # empty: pre-started, and its process had no call for it
        _chip, _calls = pickle.loads(_work)
        run_calls(_chip, _calls)
