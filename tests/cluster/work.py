"""Unit functions for the sweep tests (importable by spawned and Ray workers: ``tests.cluster.work:...``)."""

from __future__ import annotations

import os


def square(x: int) -> dict:
    return {"x": x, "square": x * x}


def pid_of(_x: int) -> int:
    return os.getpid()
