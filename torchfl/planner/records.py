"""The plain-data base of the plan's records (``plan.py``, ``buffers.py``): JSON
(de)serialisation, the lazily built tuple, the identity layout. Below every other planner
module, importing none of them, so the plan's data never pulls in the planner."""

from __future__ import annotations

from dataclasses import fields
from typing import Any
from collections.abc import Callable, Sequence

STEP_KINDS = ("kernel", "fused", "cast", "layout", "fallback", "fold")
HOST_STEPS = ("fallback", "fold")  # run by torch on the host: per call, or once (folded)
_RANK_LETTERS = {0: "", 3: "NCL", 4: "NCHW", 5: "NCDHW"}  # as torchfl.kernels.tensor.logical_letters


def identity_layout(rank: int) -> str:
    """Logical dimension letters of a rank-``rank`` tensor (4: ``NCHW``, 3: ``NCL``, 2: ``AB``)."""
    if rank in _RANK_LETTERS:
        return _RANK_LETTERS[rank]
    return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:rank]


class LazyTuple(Sequence):
    """A tuple computed on first use: ``Plan.rejected`` is built only when something reads it
    (explain, JSON, calibrate), not on every (re-)plan. Compares, slices, iterates and
    serialises as the tuple it stands for."""

    __slots__ = ("_make", "_items")

    def __init__(self, make: Callable[[], tuple]):
        self._make, self._items = make, None

    def _tuple(self) -> tuple:
        items = self._items
        if items is None:
            make = self._make  # None: another thread has just built it (it sets _items first)
            items = self._items if make is None else tuple(make())
            self._items, self._make = items, None
        return items

    def __reduce__(self):  # pickled (and deep-copied) as the plain tuple
        return (tuple, (self._tuple(),))

    def __len__(self):
        return len(self._tuple())

    def __getitem__(self, i):
        return self._tuple()[i]

    def __iter__(self):
        return iter(self._tuple())

    def __eq__(self, other):
        return self._tuple() == (other._tuple() if isinstance(other, LazyTuple) else other)

    def __hash__(self):
        return hash(self._tuple())

    def __repr__(self):
        return repr(self._tuple())


def jsonable(value: Any) -> Any:
    """``value`` as JSON types: records by their ``to_dict``, tuples as lists."""
    if isinstance(value, LazyTuple):
        value = value._tuple()
    if isinstance(value, tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return value


class Data:
    """Shared (de)serialisation for the plan's dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: jsonable(getattr(self, f.name)) for f in fields(self) if f.metadata.get("json", True)}



def as_tuple(value: Any) -> Any:
    """JSON lists back to tuples (the records' fields are tuples), recursively."""
    if isinstance(value, list):
        return tuple(as_tuple(v) for v in value)
    return value
