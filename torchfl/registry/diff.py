"""Field-level differences between two canonical documents, as dotted paths.

Mappings are walked key by key; lists and scalars are compared as whole values (a
layout list that gains ``NHCW`` is one change, which is how a vendor reads it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class Change:
    path: str
    kind: str  # "added" | "removed" | "changed"
    old: Any = None
    new: Any = None

    def __str__(self) -> str:
        unit = _unit(self.path)
        if self.kind == "added":
            return f"+ {self.path}: {_show(self.new)}{unit}"
        if self.kind == "removed":
            return f"- {self.path}: {_show(self.old)}{unit}"
        return f"{self.path}: {_show(self.old)} -> {_show(self.new)}{unit}"

    def as_dict(self) -> dict:
        out: dict = {"path": self.path, "kind": self.kind}
        if self.kind != "added":
            out["old"] = self.old
        if self.kind != "removed":
            out["new"] = self.new
        return out


# HCD format 1.1's numbers move predicted times without a unit in their values: say it
_UNITS_11 = (
    ("memory.off_chip_memory.sustained_fraction", "fraction of bandwidth"),
    (".sustained_fraction", "fraction of peak"),
    ("execution.launch_overhead_us", "us"),
    ("execution.matrix_launch_overhead_us", "us"),
    ("execution.graph_launch_overhead_us", "us"),
    ("execution.concurrent_tiles", "tiles"),
    ("execution.tile_elements", "elements"),
    ("execution.row_resident_elements", "elements"),
)


def _unit(path: str) -> str:
    if path.startswith(("sources.", "provenance.")):   # format 1.2: names and ids, no unit
        return ""
    for suffix, unit in _UNITS_11:
        if path.endswith(suffix):
            return f" ({unit})"
    return ""


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def diff(old: dict, new: dict) -> list[Change]:
    """Changes from ``old`` to ``new``, sorted by path."""
    out: list[Change] = []
    _walk(old, new, "", out)
    return sorted(out, key=lambda c: c.path)


def _walk(a: Any, b: Any, path: str, out: list[Change]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            sub = f"{path}.{key}" if path else str(key)
            va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
            if va is _MISSING:
                _leaves(vb, sub, "added", out)
            elif vb is _MISSING:
                _leaves(va, sub, "removed", out)
            else:
                _walk(va, vb, sub, out)
    elif a != b or type(a) is not type(b):
        out.append(Change(path, "changed", a, b))


def _leaves(value: Any, path: str, kind: str, out: list[Change]) -> None:
    """A whole added/removed section is reported field by field."""
    if isinstance(value, dict) and value:
        for key in sorted(value):
            _leaves(value[key], f"{path}.{key}", kind, out)
    elif kind == "added":
        out.append(Change(path, kind, new=value))
    else:
        out.append(Change(path, kind, old=value))
