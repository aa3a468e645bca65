"""Progress of long work (kernel compiles, analyze runs, the demo) that a user sees.

On a terminal: a rich progress bar whose line names the kernel compiling and for how long.
Otherwise (a pipe, a file, CI): plain timestamped lines, one per phase and one per kernel
compile (``[12:03:04] compiling conv2d_bn_relu (float16) ... 12.3 s``), and a line at least
every ``interval`` seconds while nothing else was printed, so a log never goes silent.

    with Progress(sys.stdout, "compile + run", total=12) as p:
        p.update("ResNet-50 on NPU-V2: planning")
        ...
        p.advance()
"""
from __future__ import annotations

import sys
import threading
import time

INTERVAL_S = 10.0


def _clock() -> str:
    return time.strftime("%H:%M:%S")


class Progress:
    """One task: a description, done / total, the compile in progress (see module doc)."""

    def __init__(self, stream=None, description: str = "", total: int | None = None, *,
                 compiles: bool = True, interval: float = INTERVAL_S, tty: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.description, self.total, self.done = description, total, 0
        self.detail = ""
        self.interval = interval
        self._compiles = compiles
        self._compile: tuple[str, float] | None = None     # (label, start) of the compile running
        self._compiled = [0, 0.0]
        self._last_line = 0.0
        self._t0 = time.perf_counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._rich = self._task = self._thread = self._unsubscribe = None

    # -- life cycle --
    def __enter__(self):
        if self._compiles:
            from torchfl.kernels.compiling import subscribe

            self._unsubscribe = subscribe(self.compile_event, display=True)
        if self.tty:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       SpinnerColumn, TextColumn, TimeElapsedColumn)

            self._rich = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[note]}"),
                                      console=Console(file=self.stream), transient=False)
            self._rich.start()
            self._task = self._rich.add_task(self.description, total=self.total, note="")
        else:
            self._line(self._status())
            self._thread = threading.Thread(target=self._heartbeat, name="torchfl-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._rich is not None:
            self._rich.stop()
        elif self._thread is not None:
            self._thread.join(timeout=1.0)
            n, secs = self._compiled
            tail = f"; compiled {n} kernel function(s) in {secs:.1f} s" if n else ""
            self._line(f"done: {self.description} ({self.done}/{self.total or self.done}) in "
                       f"{time.perf_counter() - self._t0:.1f} s{tail}")
        return False

    # -- updates --
    def update(self, description: str | None = None, *, completed: int | None = None,
               total: int | None = None, detail: str | None = None) -> None:
        """A new ``description`` is a phase (a line of its own when not on a terminal); a
        ``detail`` (the step running) shows on the bar and in the periodic lines only."""
        changed = description is not None and description != self.description
        if description is not None:
            self.description = description
        if detail is not None:
            self.detail = detail
        if completed is not None:
            self.done = completed
        if total is not None:
            self.total = total
        if self._rich is not None:
            desc = f"{self.description}: {self.detail}" if self.detail else self.description
            self._rich.update(self._task, description=desc, completed=self.done, total=self.total)
        elif changed:
            self._line(self._status())

    def advance(self, n: int = 1) -> None:
        self.update(completed=self.done + n)

    def print(self, text: str) -> None:
        """An event worth a line of its own (above the bar on a terminal, timestamped otherwise)."""
        if self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            self._line(text)

    # -- internals --
    def _status(self) -> str:
        count = f" ({self.done}/{self.total})" if self.total else ""
        detail = f", {self.detail}" if self.detail else ""
        return f"{self.description}{count}{detail}"

    def _line(self, text: str, stamp: bool = True) -> None:
        with self._lock:
            self.stream.write((f"[{_clock()}] " if stamp else "") + text + "\n")
            self.stream.flush()
            self._last_line = time.perf_counter()

    def compile_event(self, ev) -> None:
        """Show a kernel compile (a CompileEvent: from this process, or a worker's)."""
        if ev.kind == "start":
            self._compile = (ev.label, time.perf_counter())
            if self._rich is not None:
                self._rich.update(self._task, note=f"compiling {ev.label}")
            return
        self._compile = None
        self._compiled[0] += 1
        self._compiled[1] += ev.seconds
        if self._rich is not None:
            self._rich.update(self._task, note="")
            if ev.seconds >= 1.0:
                self._rich.console.print(f"  compiled {ev.label} in {ev.seconds:.1f} s", highlight=False)
        else:
            self._line(f"compiling {ev.label} ... {ev.seconds:.1f} s")

    def _heartbeat(self) -> None:
        tick = min(1.0, self.interval / 4)
        while not self._stop.wait(tick):
            if time.perf_counter() - self._last_line < self.interval:
                continue
            comp = self._compile
            what = f"; compiling {comp[0]} for {time.perf_counter() - comp[1]:.0f} s" if comp else ""
            self._line(f"{self._status()}: still working, {time.perf_counter() - self._t0:.0f} s{what}")
