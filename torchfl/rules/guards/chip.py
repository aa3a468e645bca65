"""The ``chip`` namespace that guards read: the HCD's numbers and capabilities, not its name.

``chip.<section>.<field>`` follows the HCD's own field paths (``chip.compute_units.
attention.supported_heads``, ``chip.constraints.max_sequence_length``), plus two derived
lists: ``chip.dtypes`` (short names such as ``float16``) and ``chip.layouts`` (every
layout some unit computes in, default first). The HCD's ``chip:`` section (name, vendor,
version, device type) is deliberately absent: packs are chip-agnostic, and a rule that
must be limited to a device type says so in ``requires.device_types``.
"""

from __future__ import annotations

import types
import typing

from pydantic import BaseModel

from torchfl.hcd import HCD
from torchfl.rules.guards.types import BOOL, FLOAT, INT, STR, Type, list_of, optional, record

def _guard_type(annotation, path: str) -> Type:
    """The guard type of one HCD model field: nested models become records named by their
    path, ``Optional`` optional, ``list[...]`` lists, constrained scalars their base type."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _guard_type(args[0], path)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"{path}: the guard view has no type for the union {annotation!r}")
        return optional(_guard_type(inner[0], path))
    if origin is list:
        return list_of(_guard_type(args[0], path))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _record(annotation, path)
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    raise TypeError(f"{path}: the guard view has no type for the HCD field type {annotation!r}")


def _record(model, path: str, skip=()) -> Type:
    return record(path, **{name: _guard_type(f.annotation, f"{path}.{name}")
                           for name, f in model.model_fields.items() if name not in skip})


_SCALARS = {bool: BOOL, int: INT, float: FLOAT, str: STR}

#: ``chip.*``: every HCD section but ``chip:`` (identity) and format 1.2's ``sources`` and
#: ``provenance`` (where numbers come from, not what the chip can do), derived from the model,
#: plus the derived lists ``dtypes`` and ``layouts``
CHIP = record("chip", **dict(_record(HCD, "chip", skip=("chip", "sources", "provenance")).fields),
              dtypes=list_of(STR), layouts=list_of(STR))


def chip_view(hcd) -> dict:
    """Plain data for ``chip.*`` from an HCD; every field of :data:`CHIP` is present, absent ones as None."""
    data = hcd.canonical()
    data.pop("chip", None)
    data.setdefault("constraints", {}).setdefault("bfloat16_emulation", False)
    data["dtypes"] = list(hcd.dtypes)
    data["layouts"] = list(hcd.layouts)
    return _fill(data, CHIP)


def _fill(data, t):
    """Keep only the fields the type declares (nothing else is reachable) and add absent ones as None."""
    if t.kind == "optional":
        t = t.elem
    if t.kind != "record" or not isinstance(data, dict):
        return data
    return {name: (None if data.get(name) is None else _fill(data[name], ft)) for name, ft in t.fields}
