"""Units on this machine: in this process (one job) or a pool of spawned worker processes.

The same :func:`~torchfl.cluster.units.execute` runs each unit as on a cluster; the pool is
what ``--jobs N`` always was (spawned processes, one thread each).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from torchfl.cluster.units import Done, Job, Unit, execute


def _init(parent: int, env: tuple = ()) -> None:
    """Spawned worker: one thread per process and the job's process environment before torch or
    Numba are imported, and the worker ends with the driver however that ends (issue 39: the
    harness's own guard)."""
    import os

    from torchfl.kernels.lifetime import die_with_parent

    os.environ["NUMBA_NUM_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.update(dict(env))
    die_with_parent(parent)


class LocalRunner:
    """``jobs`` worker processes (1: this process)."""

    def __init__(self, jobs: int = 1):
        self.jobs = max(1, int(jobs))

    def describe(self) -> str:
        return "this process" if self.jobs == 1 else f"{self.jobs} local worker processes"

    def run(self, units: list[Unit], job: Job) -> Iterator[Done]:
        """Yield each unit's :class:`Done` as it finishes."""
        if self.jobs <= 1 or len(units) <= 1:
            job = replace(job, threads=None)   # in-process: the caller's threads stay as they are
            for unit in units:
                yield execute(unit, job)
            return
        import multiprocessing
        import os
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(self.jobs, len(units)), mp_context=ctx, initializer=_init,
                                 initargs=(os.getpid(), job.process_env)) as pool:
            futures = [pool.submit(execute, unit, job) for unit in units]
            try:
                for fut in as_completed(futures):
                    yield fut.result()
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise

    def close(self) -> None:
        pass
