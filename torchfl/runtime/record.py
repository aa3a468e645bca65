"""What one measured run of a plan did (``Executor.run(args, record=Record())``): per step the
Traffic the kernel counted and its wall time, route accounting per ATen op, the allocator's peak."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

__all__ = ["Record", "StepRecord", "HOST_ROUTES"]

HOST_ROUTES = {"fallback": "CPU fallback", "fold": "host fold (once)"}  # route accounting labels


@dataclass
class StepRecord:
    """What one step did in one run: counted traffic (None for a fallback) and wall time."""

    index: int
    kind: str
    kernel: str | None
    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    wall_s: float = 0.0
    counted: bool = False


@dataclass
class Record:
    """Measurements of one run (``run(args, record=Record())``)."""

    steps: list = field(default_factory=list)
    routes: dict = field(default_factory=lambda: defaultdict(Counter))
    total_s: float = 0.0
    kernel_s: float = 0.0
    peak_bytes: int = 0        # the allocator's peak during the run, above base_bytes
    base_bytes: int = 0        # allocated on the chip when the run began (other plans' weights)
    on_step: object = None     # callable(done, total, step) after each step (progress bars)
    # per-call steps read the static values the executor keeps (frozen: packed GEMM weights)
    # where it keeps them, as a real call does; the static steps still run and are counted
    kept_static: bool = False
