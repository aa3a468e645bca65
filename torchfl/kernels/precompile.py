"""Compile kernels in a helper process while this one runs: a cold first call on 2 cores.

Numba compiles on one core holding the GIL, and a model's first call compiles its kernels
one after the other. A helper process given the calls that are still ahead (kernel, input
shapes, storage dtypes, layouts, attributes) calls each kernel once on scratch inputs of
exactly those types, last call first, so it compiles the same specialisations into the
shared kernel cache (see :mod:`jitcache`) while this process compiles from the first call
on; when this process reaches a kernel the helper has compiled, Numba loads it from the
cache. Scratch inputs are uninitialised (types, not values, decide what Numba compiles); a
call that fails in the helper costs nothing, this process compiles it as usual. The helper
imports numpy and numba, never torch.

    helper = start(chip, calls)      # None if it could not start
    ...
    helper.wait()                    # optional: the helper exits when done
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from dataclasses import dataclass

ENV = "TORCHFL_COMPILE_HELPERS"   # 0 turns the helper off (default: on where there are 2+ CPUs)


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

    @property
    def key(self) -> tuple:
        """Calls with equal keys compile the same code (shapes aside)."""
        return (self.impl, tuple(sorted((self.dtypes[k], len(s)) for k, s in self.shapes.items())),
                tuple(sorted((k, type(v).__name__) for k, v in self.attrs.items())))


def enabled() -> bool:
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return False
    return (os.cpu_count() or 1) > 1


def run_calls(chip, calls) -> int:
    """Call each kernel once on scratch inputs (in this process); returns the calls that ran."""
    from .catalog import CATALOG
    from .memory import DeviceMemory
    from .tensor import DeviceTensor

    done = 0
    for c in calls:
        try:
            spec = CATALOG[c.kernel]
            problem = spec.problem(c.shapes, c.attrs, c.dtype, c.layouts, c.dtypes)
            plan = spec.tile(problem, chip)
            memory = DeviceMemory(chip)
            inputs = {k: DeviceTensor.empty(memory, c.shapes[k], c.dtypes[k], c.layouts.get(k))
                      for k in c.shapes}
            spec.bind(chip, problem, plan, memory)(inputs)
            done += 1
        except Exception:  # noqa: BLE001 - the caller compiles what the helper could not
            continue
    return done


def start(chip, calls, skip=()):
    """A helper process compiling ``calls`` (deduplicated, last first, none whose key is in
    ``skip``: this process compiles those now); None if none started."""
    seen, todo = set(skip), []
    for c in reversed(calls):
        if c.key not in seen:
            seen.add(c.key)
            todo.append(c)
    if not todo:
        return None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "torchfl.kernels.precompile"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc.stdin.write(pickle.dumps((chip, todo)))
        proc.stdin.close()
    except OSError:
        return None
    return proc


if __name__ == "__main__":
    _chip, _calls = pickle.loads(sys.stdin.buffer.read())
    run_calls(_chip, _calls)
