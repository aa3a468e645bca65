"""The dtype vocabulary of the whole tree, stated once (no torch, no numpy at import).

An HCD lists dtypes as ``torch.<name>``; everywhere else a dtype is its short name
(``float16``). This module says which names exist, how many bytes an element takes, how
the emulated chip stores each (numpy storage names), which compute unit runs it and how
logs spell it. ``kernels.dtypes`` adds the codecs, the planner and the runtime import the
tables from here: a new dtype is added in this one place.
"""
from __future__ import annotations

__all__ = ["ITEMSIZE", "STORAGE", "FLOATS", "PRECISIONS", "PRECISION_CHOICES", "UNIT_OF_DTYPE", "MATRIX_UNITS",
           "DTYPE_ALIASES", "short_dtype", "dtype_name", "unit_label"]

#: bytes per element of every dtype a captured graph may carry (host-only ones included:
#: a CPU fallback still moves float64 tensors over the off-chip link)
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "int32": 4, "int64": 8, "bool": 1,
            "float64": 8, "uint8": 1, "int16": 2}

#: the emulated chip's storage dtypes -> the numpy dtype that holds their bits (float16 and
#: bfloat16 as uint16 patterns: Numba has no float16 on the CPU target)
STORAGE = {"float32": "float32", "float16": "uint16", "bfloat16": "uint16", "int8": "int8",
           "int32": "int32", "int64": "int64", "bool": "bool"}

FLOATS = ("float32", "float16", "bfloat16")

#: the precision policies (torch.compile ``options={"precision": ...}``): the float dtype a
#: graph is computed in on the chip (float32: float64 values computed in float32)
PRECISIONS = ("float16", "bfloat16", "float32")
#: what every command's ``--precision`` takes: a policy, ``auto`` (none on a chip with a float32
#: unit, else the first half-precision one it stores) or ``none`` (the graph's dtypes as written)
PRECISION_CHOICES = ("auto", *PRECISIONS, "none")

#: dtype (short name) -> the compute-unit key of an HCD that runs it natively
UNIT_OF_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int8": "int8"}
MATRIX_UNITS = ("fp16", "bf16", "fp32", "int8")


def short_dtype(dtype) -> str:
    """``torch.float16`` (a torch dtype or its string) -> ``float16``; a short name is kept."""
    return str(dtype).removeprefix("torch.")


#: what users also write for a dtype (torch's aliases and the units' keys) -> its short name
DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16", "float": "float32", "fp32": "float32",
                 "long": "int64", "int": "int32"}


def dtype_name(dtype) -> str:
    """A dtype as a user may write it (``torch.half``, ``fp16``, ``float16``, a torch dtype)
    -> its short name (``float16``); a name it does not know is returned for the caller to refuse."""
    name = short_dtype(dtype).strip()
    return DTYPE_ALIASES.get(name, name)


def unit_label(dtype: str) -> str:
    """How logs and reports spell a dtype: its unit's key (``fp16``), else the name itself."""
    return UNIT_OF_DTYPE.get(dtype, dtype)
