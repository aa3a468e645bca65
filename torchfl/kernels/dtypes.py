"""Storage dtypes of the emulated chip and their numpy-level codecs (no numba, no torch
at import).

float16 and bfloat16 are stored as ``uint16`` bit patterns (Numba has no float16 on the
CPU target); kernels decode to float32, accumulate in float32 and round to nearest even
on store (``codecs.py`` holds the jitted twins of these functions).

Tolerances against torch (used by the tests, see tests/kernels/tolerances.py):

=========  ===========  =====================================================================
dtype      rtol / atol  why
=========  ===========  =====================================================================
float32    1e-4 / 1e-5  same inputs, fp32 accumulation in a different order (tiles, vectors)
float16    2e-3 / 2e-3  11-bit significand: one RNE rounding on store is 2^-11 ~ 4.9e-4;
                        torch may round intermediates (fp16 GEMM on CPU) differently
bfloat16   1.6e-2/1e-2  8-bit significand: RNE on store is 2^-8 ~ 3.9e-3, plus torch's own
                        bf16 intermediate rounding
bf16 emu.  3.2e-2/2e-2  inputs pass through fp16 (range/precision), result truncated (not
                        rounded) to bf16: up to one bf16 ulp 2^-7 ~ 7.8e-3 below, plus above
int8       exact        int32 accumulation is exact; requantisation RNE within 1 step
=========  ===========  =====================================================================
"""
from __future__ import annotations

__all__ = ["DTYPES", "CODE", "storage_dtype", "itemsize", "encode", "decode", "check_dtype",
           "is_float", "stored", "from_torch_dtype", "torch_dtype"]

# the vocabulary (names, sizes, numpy storage names) is the HCD layer's; numpy itself is
# imported lazily: the catalog and the planner use itemsize() without loading numpy
from torchfl.hcd.dtypes import FLOATS, ITEMSIZE, STORAGE as DTYPES, dtype_name

# integer codes the jitted kernels branch on (one compiled body serves all floats)
CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "bfloat16_emulated": 3, "int8": 4,
        "int32": 5, "int64": 6, "bool": 7}


def check_dtype(name: str) -> str:
    if name not in DTYPES:
        raise ValueError(f"unknown storage dtype {name!r}; use one of {', '.join(DTYPES)}")
    return name


def stored(name: str) -> bool:
    """Can the chip's memory hold ``name``? Any other dtype (float64, complex, uint8, ...)
    lives on the host: uploads convert it (the precision policy) and host fallbacks read it."""
    return name in DTYPES


def storage_dtype(name: str):
    import numpy as np

    return np.dtype(DTYPES[check_dtype(name)])


def itemsize(name: str) -> int:
    return ITEMSIZE[check_dtype(name)]


def is_float(name: str) -> bool:
    return name in FLOATS


def code(name: str, bf16_emulation: bool = False) -> int:
    """Kernel codec code; bfloat16 under emulation computes through float16."""
    if name == "bfloat16" and bf16_emulation:
        return CODE["bfloat16_emulated"]
    return CODE[check_dtype(name)]


def _f32_to_bf16_bits(x):
    import numpy as np

    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def encode(x, name: str):
    """Logical values (any float/int array) -> storage array of dtype ``name`` (RNE)."""
    import numpy as np

    x = np.asarray(x)
    if name == "float32":
        return x.astype(np.float32)
    if name == "float16":
        return x.astype(np.float32).astype(np.float16).view(np.uint16)  # numpy rounds RNE
    if name == "bfloat16":
        return _f32_to_bf16_bits(x.astype(np.float32))
    return x.astype(storage_dtype(name))


def decode(s, name: str):
    """Storage array -> values (float32 for float dtypes, the integer/bool type otherwise)."""
    import numpy as np

    s = np.asarray(s)
    if name == "float16":
        return s.view(np.float16).astype(np.float32)
    if name == "bfloat16":
        return (s.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return s


def from_torch_dtype(dt) -> str:
    """``torch.float16`` (object or string) -> ``float16``."""
    return check_dtype(dtype_name(dt))


def torch_dtype(name: str):
    import torch

    return getattr(torch, check_dtype(name))
