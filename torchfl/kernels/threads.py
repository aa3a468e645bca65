"""Run small problems on one thread.

Waking Numba's OpenMP workers costs a fixed ~0.1 ms on an idle machine and up to ~12 ms
on a loaded one (measured: a 16x16 matmul took 12 ms on 2 threads, 0.36 ms on 1), so a
kernel whose work is below ``SMALL_FLOPS`` runs its parallel loops with one thread
(``numba.set_num_threads`` is per calling thread and cheap)."""
from __future__ import annotations

from contextlib import contextmanager

SMALL_FLOPS = 1 << 26     # ~1.3 ms of one core at 50 GFLOP/s
ELEMENT_WORK = 256        # memory-bound kernels count this per element: >= 256K elements go parallel


def conv_small() -> int:
    """The FLOPs under which a convolution runs on one thread: a quarter of SMALL_FLOPS. Why
    lower than a GEMM's: a conv's parallel split is even (balance 0.98+), and
    ResNet-50's 1x1 convs of 25-51 MFLOP (0.5-1 ms) still gain from a second core on an idle
    host; the convs this keeps on one thread (MobileNet's, <= a few MFLOP) gain nothing and
    cost tens of ms when a worker waits for a time slice."""
    return SMALL_FLOPS // 4


def parts_for(elements: int) -> int:
    """The threads a memory-bound call of ``elements`` gets (``threads_for``'s rule at
    ELEMENT_WORK a element): all of them from SMALL_FLOPS / ELEMENT_WORK elements on, else 1.
    A host split (elementwise, layout) cuts its call into this many equal parts."""
    from numba import get_num_threads

    return get_num_threads() if elements * ELEMENT_WORK >= SMALL_FLOPS else 1


@contextmanager
def threads_for(work: int, small: int | None = None):
    from numba import get_num_threads, set_num_threads

    small = SMALL_FLOPS if small is None else small
    n = get_num_threads()
    if work < small and n > 1:
        set_num_threads(1)
        try:
            yield 1
        finally:
            set_num_threads(n)
    else:
        yield n


def sized_by(elements_of):
    """Decorator for a memory-bound kernel's ``run(ctx)``: its parallel loops run on one
    thread when ``elements_of(problem)`` is under SMALL_FLOPS / ELEMENT_WORK (a 128 x 768
    layer-norm took 8 ms on 2 threads of a loaded machine, 1 ms on one)."""
    import functools

    def wrap(run):
        @functools.wraps(run)
        def sized(ctx):
            with threads_for(elements_of(ctx.problem) * ELEMENT_WORK):
                return run(ctx)
        return sized
    return wrap


def sized_by_plan(small):
    """Decorator for a compute-bound kernel's ``run(ctx)``: its parallel loops run on one
    thread when the plan's FLOPs (``ctx.plan.traffic``, the cost model's count) are under
    ``small()``."""
    import functools

    def wrap(run):
        @functools.wraps(run)
        def sized(ctx):
            with threads_for(ctx.plan.traffic.flops, small()):
                return run(ctx)
        return sized
    return wrap
