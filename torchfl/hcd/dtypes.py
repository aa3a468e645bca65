"""The dtype vocabulary of the whole tree, stated once (no torch, no numpy at import).

An HCD lists dtypes as ``torch.<name>``; everywhere else a dtype is its short name
(``float16``). This module says which names exist, how many bytes an element takes, how
the emulated chip stores each (numpy storage names), which compute unit runs it and how
logs spell it. ``kernels.dtypes`` adds the codecs, the planner and the runtime import the
tables from here: a new dtype is added in this one place.
"""
from __future__ import annotations

__all__ = ["ITEMSIZE", "STORAGE", "FLOATS", "UNIT_OF_DTYPE", "MATRIX_UNITS", "short_dtype", "unit_label"]

#: bytes per element of every dtype a captured graph may carry (host-only ones included:
#: a CPU fallback still moves float64 tensors over the off-chip link)
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "int32": 4, "int64": 8, "bool": 1,
            "float64": 8, "uint8": 1, "int16": 2}

#: the emulated chip's storage dtypes -> the numpy dtype that holds their bits (float16 and
#: bfloat16 as uint16 patterns: Numba has no float16 on the CPU target)
STORAGE = {"float32": "float32", "float16": "uint16", "bfloat16": "uint16", "int8": "int8",
           "int32": "int32", "int64": "int64", "bool": "bool"}

FLOATS = ("float32", "float16", "bfloat16")

#: dtype (short name) -> the compute-unit key of an HCD that runs it natively
UNIT_OF_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int8": "int8"}
MATRIX_UNITS = ("fp16", "bf16", "fp32", "int8")


def short_dtype(dtype) -> str:
    """``torch.float16`` (a torch dtype or its string) -> ``float16``; a short name is kept."""
    return str(dtype).removeprefix("torch.")


def unit_label(dtype: str) -> str:
    """How logs and reports spell a dtype: its unit's key (``fp16``), else the name itself."""
    return UNIT_OF_DTYPE.get(dtype, dtype)
