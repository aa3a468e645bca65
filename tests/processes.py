"""Process trees read from /proc, for the tests that kill a parent and check its workers end
(conformance's pool, `kernels warmup`)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a live process; None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else (int(fields[1]), fields[0])


def descendants(root: int) -> set[int]:
    """Every live process below ``root``."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := stat(int(entry.name))) is not None:
            parents[int(entry.name)] = st[0]
    out, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - out
        out |= frontier
    return out


def still_alive(pids: set[int], seconds: float) -> set[int]:
    """Those of ``pids`` still running after waiting up to ``seconds`` for them to end."""
    deadline, alive = time.monotonic() + seconds, set(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.5)
        alive = {pid for pid in alive if stat(pid) is not None}
    return alive


def kill_left_behind(proc, children: set[int]) -> None:
    """SIGKILL ``proc`` and whatever of its process tree a failed test left running."""
    if proc.poll() is None:
        proc.kill()
    for pid in children | descendants(proc.pid):
        if stat(pid) is not None:
            os.kill(pid, signal.SIGKILL)
