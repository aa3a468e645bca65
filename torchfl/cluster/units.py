"""The unit of work and the one function that runs it on any worker.

A :class:`Unit` is a stable key (unique in its sweep: the registry's ``(run, unit)`` key) and
a function to call with picklable arguments, named ``"module:function"`` so that each node
imports its own copy (a callable is accepted too: a tool's function, pickled as the runner
pickles). :func:`execute` is what a local process or a Ray task runs for every unit: it
checks the worker against the driver's :class:`~torchfl.cluster.fingerprint.Fingerprint`,
returns the stored result when the unit was written already (a retried task), else calls the
unit and writes its result in its own transaction, once. The result a caller sees is always
the stored (JSON) form, so local, cluster and resumed runs aggregate the same values.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import time
from dataclasses import dataclass

from torchfl.cluster.fingerprint import Fingerprint, check


@dataclass(frozen=True)
class Unit:
    key: str
    fn: object            # "package.module:function", or a picklable callable
    args: tuple = ()

    def call(self):
        fn = self.fn
        if isinstance(fn, str):
            module, _, name = fn.partition(":")
            fn = getattr(importlib.import_module(module), name)
        return fn(*self.args)


@dataclass(frozen=True)
class Job:
    """What travels with every unit: where results go and what the worker must be."""

    expect: Fingerprint
    registry_url: str | None = None   # None: results are not recorded (``--no-record``)
    run_id: int | None = None
    threads: int | None = 1           # threads per unit in a worker process; None: leave as is (in-process)
    #: environment a worker process needs from its start, before torch is imported (the eager
    #: device's ``TORCHFL_DEVICES``): the runner starts workers with it; never a secret (Ray records it)
    process_env: tuple = ()
    #: environment set in the worker just before each unit (``TORCHFL_REGISTRY_URL``): may hold a password
    unit_env: tuple = ()


@dataclass(frozen=True)
class Done:
    """A finished unit: its (stored) result, where and how long it ran, and whether this
    attempt wrote it (False: stored before, by an earlier attempt or run; or not recorded)."""

    unit: str
    result: object
    node: str
    seconds: float
    written: bool = False
    resumed: bool = False      # taken from the registry when the run was resumed, not run now


def node_name() -> str:
    """``host`` plus the Ray node (first 8 hex digits) when in a Ray worker, and the pid."""
    import sys

    where = socket.gethostname()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        try:
            where += f"/{ray.get_runtime_context().get_node_id()[:8]}"
        except Exception:  # noqa: BLE001 - a name for a log line; the host alone will do
            pass
    return f"{where} pid {os.getpid()}"


_SET_UP = False


def _setup(threads: int | None) -> None:
    """Once per worker process: ``threads`` threads for torch, OpenMP and Numba, warnings
    quiet (a unit's result carries what matters)."""
    global _SET_UP
    if _SET_UP or threads is None:
        return
    import logging
    import warnings

    for var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = str(threads)
    import torch

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    _SET_UP = True


_REGISTRIES: dict = {}


def _sweeps(url: str):
    from torchfl.registry import Registry
    from torchfl.registry.sweeps import Sweeps

    if url not in _REGISTRIES:
        _REGISTRIES[url] = Sweeps(Registry(url))
    return _REGISTRIES[url]


def execute(unit: Unit, job: Job) -> Done:
    """Run ``unit`` here (see the module doc); raises VersionMismatch on a foreign worker."""
    where = node_name()
    check(job.expect, where)
    recorded = job.registry_url is not None and job.run_id is not None
    if recorded:
        stored = _sweeps(job.registry_url).result(job.run_id, unit.key)
        if stored is not None:
            return Done(unit.key, stored.result, stored.node, stored.seconds)
    _setup(job.threads)
    if job.threads is not None:       # a worker process of its own (in-process runs keep the caller's)
        os.environ.update(dict(job.unit_env))
    t0 = time.perf_counter()
    result = unit.call()
    seconds = time.perf_counter() - t0
    if not recorded:
        from torchfl.registry.sweeps import encode

        return Done(unit.key, json.loads(encode(result)), where, seconds)
    rec = _sweeps(job.registry_url).record_unit(job.run_id, unit.key, result, node=where, seconds=seconds)
    return Done(unit.key, rec.result, rec.node, rec.seconds, written=rec.written)
