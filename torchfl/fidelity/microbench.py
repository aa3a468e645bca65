"""The probe's measuring kit: a timer (wall or one thread's CPU time), the figures it yields
(runs in SI units, the median used, a comment with their spread) and the microbenchmarks
through torch itself: GEMM per dtype, streaming copy/read/fill, the tiniest calls."""
from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import dataclass


class ProbeError(ValueError):
    """A probe that cannot run as asked (bad device, thread count, timer): the message says
    what and how to fix it."""


@dataclass(frozen=True)
class Figure:
    """One measured number: its per-run values in SI units (ops/s, B/s, s); the median is the
    figure. ``shown`` is (factor, unit) for the comment (1e-9, "GB/s")."""

    name: str
    runs: tuple
    how: str
    shown: tuple = (1.0, "")

    @property
    def value(self) -> float:
        return float(statistics.median(self.runs))

    def comment(self) -> str:
        k, unit = self.shown
        lo, mid, hi = min(self.runs) * k, self.value * k, max(self.runs) * k
        runs = "values" if self.name == "matrix_launch" else "runs"
        return f"{self.how}: {len(self.runs)} {runs} min/median/max {number_text(lo)}/{number_text(mid)}/{number_text(hi)} {unit} (median used)"


def number_text(x: float) -> str:
    """A number as YAML reads it back: 4 significant digits, no exponent for ordinary sizes."""
    if x == 0:
        return "0"
    s = f"{x:.4g}"
    if "e" in s:
        s = f"{x:.{max(0, 3 - math.floor(math.log10(abs(x))))}f}"
    if re.fullmatch(r"-?\d+", s):
        s += ".0"
    return s


# -- timing -----------------------------------------------------------------------------------

class Timer:
    """Per-call seconds of ``fn``: ``repeat`` samples of ``number`` calls after ``warmup`` calls.

    ``wall``: perf_counter (CUDA: synchronised before and after); ``cpu``: this thread's CPU
    time (user + system, so page faults count), exact when torch computes on this thread."""

    def __init__(self, kind: str = "wall", device: str = "cpu"):
        if kind not in ("wall", "cpu"):
            raise ProbeError(f"unknown timer {kind!r}; use wall or cpu")
        if kind == "cpu" and device != "cpu":
            raise ProbeError("--timer cpu times the host thread; a CUDA device is timed with --timer wall")
        self.kind, self.device = kind, device
        self._now = time.thread_time if kind == "cpu" else time.perf_counter
        self._sync = None
        if device == "cuda":
            import torch

            self._sync = torch.cuda.synchronize

    def once(self, fn) -> float:
        if self._sync:
            self._sync()
        t = self._now()
        fn()
        if self._sync:
            self._sync()
        return self._now() - t

    def runs(self, fn, number: int = 1, repeat: int = 5, warmup: int = 1) -> list[float]:
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeat):
            if self._sync:
                self._sync()
            t = self._now()
            for _ in range(number):
                fn()
            if self._sync:
                self._sync()
            out.append((self._now() - t) / number)
        return out

    def calls_for(self, fn, target_s: float, cap: int = 100_000) -> int:
        """How many calls of ``fn`` make a sample of about ``target_s`` (after one warm call)."""
        fn()
        one = max(self.once(fn), 1e-7)
        return max(1, min(cap, int(target_s / one)))


# -- the microbenchmarks ------------------------------------------------------------------------

def gemm(torch, dtype_name, dev, timer, target_s, n_max, repeat) -> Figure | None:
    """ops/s of torch's GEMM for ``dtype_name``: n doubles from 64 until one call takes
    ``target_s`` (or n reaches ``n_max``); the last size is measured ``repeat`` times."""
    dt = getattr(torch, dtype_name)
    g = torch.Generator(device=dev).manual_seed(0)

    def operands(n):
        if dtype_name == "int8":
            a = torch.randint(-8, 8, (n, n), dtype=torch.int8, device=dev, generator=g)
            b = a.clone()
            return a, b, (lambda: torch._int_mm(a, b))
        a = torch.randn(n, n, device=dev, generator=g).to(dt)
        b = a.clone()
        return a, b, (lambda: torch.mm(a, b))

    n, tried = 64, []
    while True:
        try:
            a, b, fn = operands(n)
            fn()
        except (RuntimeError, NotImplementedError, AttributeError):
            return None      # torch has no such GEMM on this device: the unit is left out
        one = timer.once(fn)
        tried.append(n)
        if one >= target_s or n >= n_max:
            break
        n *= 2
    number = max(1, int(target_s / max(one, 1e-9) / 4))
    secs = timer.runs(fn, number=number, repeat=repeat, warmup=1)
    unit = "GOP/s" if dtype_name == "int8" else "GFLOP/s"
    op = "torch._int_mm" if dtype_name == "int8" else "torch.mm"
    return Figure(f"gemm_{dtype_name}", tuple(2 * n ** 3 / s for s in secs),
                  f"{op} {dtype_name} {n}x{n}x{n} (sizes tried {', '.join(map(str, tried))})", (1e-9, unit))


def stream(torch, dev, timer, nbytes, repeat) -> dict:
    """Copy (2 x bytes), read-only sum (bytes) and fill (bytes) over float32 arrays of ``nbytes``."""
    n = max(1024, nbytes // 4)
    x = torch.rand(n, device=dev)
    y = torch.empty_like(x)
    y.fill_(1.0)                                   # touch every page before timing
    out = {}
    for key, fn, moved, what in (
            ("copy_bw", lambda: y.copy_(x), 2 * n * 4, "copy y.copy_(x)"),
            ("read_bw", lambda: x.sum(), n * 4, "read x.sum()"),
            ("write_bw", lambda: y.fill_(0.5), n * 4, "write y.fill_()")):
        number = timer.calls_for(fn, 0.01)
        secs = timer.runs(fn, number=number, repeat=repeat, warmup=1)
        out[key] = Figure(key, tuple(moved / s for s in secs),
                          f"{what} of {n * 4 / (1 << 20):.4g} MiB float32 ({moved // (n * 4)} x bytes counted)",
                          (1e-9, "GB/s"))
    return out


def tiny_ops(torch, device, clock, quick, repeat) -> dict:
    """The fixed cost of the tiniest calls: a one-element ``torch.add`` (``launch``) and, since a
    matrix family's call (a library that picks and launches its kernels) costs more than an
    elementwise one, the tiniest linear, conv2d and attention, each timed like the add
    (``matrix_launch``: one median each)."""
    a = torch.ones(1, device=device)
    fn = lambda: torch.add(a, a)  # noqa: E731
    number = clock.calls_for(fn, 0.002 if quick else 0.01, cap=20_000)
    out = {"launch": Figure("launch", tuple(clock.runs(fn, number=number, repeat=repeat, warmup=100)),
                            "one-element torch.add (dispatch + allocation)", (1e6, "us"))}
    x2, w2 = torch.ones(1, 1, device=device), torch.ones(1, 1, device=device)
    x4, w4 = torch.ones(1, 3, 8, 8, device=device), torch.ones(4, 3, 3, 3, device=device)
    q = torch.ones(1, 1, 1, 1, device=device)
    tiny = {"linear 1x1x1": lambda: torch.nn.functional.linear(x2, w2),
            "conv2d 1x3x8x8 * 4x3x3x3": lambda: torch.conv2d(x4, w4),
            "sdpa 1x1x1x1": lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)}
    each = {}
    for what, f in tiny.items():
        n_calls = clock.calls_for(f, 0.002 if quick else 0.01, cap=20_000)
        each[what] = statistics.median(clock.runs(f, number=n_calls, repeat=repeat, warmup=20))
    out["matrix_launch"] = Figure("matrix_launch", tuple(each.values()),
                                  "the tiniest " + ", ".join(each) + " (one median each; their median used)",
                                  (1e6, "us"))
    return out
