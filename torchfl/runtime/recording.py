"""Explain's recorder: ``with recording(analyze) as rec:`` -- every compiled graph executed
inside (``backend.CompiledGraph``) reports its plan, and with ``analyze`` its measured run
(:class:`~torchfl.runtime.record.Record`), to ``rec.entries``. Per thread, nestable.
"""
from __future__ import annotations

import threading

__all__ = ["recording", "Recorder", "active"]

_TLS = threading.local()     # per thread: the stack of active recorders


class Recorder:
    """Collects (plan, record) of every graph executed while active (explain)."""

    def __init__(self, analyze: bool):
        self.analyze = analyze
        self.entries = []   # (CompiledGraph, plan, Record | None)

    def run(self, graph, plan, executor, args):
        """Run ``executor`` for ``graph`` (measured when analysing) and keep the entry."""
        record = None
        if self.analyze:
            from .record import Record

            record = Record()
        out = executor.run(args, record)
        self.entries.append((graph, plan, record))
        return out


class recording:
    """``with recording(analyze) as rec:`` -- graphs executed inside report to ``rec``."""

    def __init__(self, analyze: bool = False):
        self.rec = Recorder(analyze)

    def __enter__(self):
        stack = getattr(_TLS, "stack", None)
        if stack is None:
            stack = _TLS.stack = []
        stack.append(self.rec)
        return self.rec

    def __exit__(self, *exc):
        _TLS.stack.pop()


def active():
    """The innermost active recorder of this thread, or None."""
    stack = getattr(_TLS, "stack", None)
    return stack[-1] if stack else None
