"""ChipModel's hash is the planner's price-cache key (planner/cost.py, candidates.py). It reads
every field of the dataclass, so no field can be left out of it (issue 50 item 1: the hand-written
tuple it replaces had left ``units`` out; the next field added would have had to be remembered)."""
from __future__ import annotations

import pickle
from dataclasses import fields, replace

from torchfl.kernels.chip import ChipModel


def _other(name: str, value):
    """A valid value of field ``name`` other than ``value``."""
    if name == "submission":
        return "graph" if value != "graph" else "eager"
    if isinstance(value, dict):
        return {**value, "int8": 1.0} if "int8" not in value else {k: v for k, v in value.items() if k != "int8"}
    if isinstance(value, bool):
        return not value
    if isinstance(value, str):
        return value + "x"
    if value is None:
        return 1 << 20 if name == "memory_bytes" else 1e-6
    if isinstance(value, float):
        return value * 0.5 if value else 1e-6
    return value * 2 if value else 4


def test_every_field_changes_the_hash():
    base = ChipModel()
    for f in fields(ChipModel):
        value = getattr(base, f.name)
        changes = {f.name: _other(f.name, value)}
        if f.name in ("concurrent_tiles", "tile_elements"):      # set together (both > 0)
            changes = {"concurrent_tiles": 4, "tile_elements": 16}
        other = replace(base, **changes)
        assert other != base and hash(other) != hash(base), f.name


def test_equal_chips_hash_equal_also_after_a_pickle():
    a, b = ChipModel(name="A", peak={"float16": 1e12}, sustained={"float16": 0.5}), \
        ChipModel(name="A", peak={"float16": 1e12}, sustained={"float16": 0.5})
    assert a == b and hash(a) == hash(b)
    c = pickle.loads(pickle.dumps(a))
    assert c == a and hash(c) == hash(a) and {a: 1}[c] == 1
