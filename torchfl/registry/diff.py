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


def _unit(path: str) -> str:
    """`` (us)`` and the like beside a format-1.1 number, whose value has no unit of its own
    (the units are listed once, with the fields: ``torchfl.hcd.model.FORMAT_11_FIELDS``)."""
    from torchfl.hcd.model import FORMAT_11_FIELDS, format_11_field

    key = format_11_field(path)
    unit = FORMAT_11_FIELDS[key][0] if key else ""
    return f" ({unit})" if unit else ""


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
