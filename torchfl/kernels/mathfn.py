"""Branch-free float32 math that LLVM vectorises (Numba's math.exp is a scalar libm call:
without SVML, exp-bound loops run ~10x slower than torch's vectorised exp)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .codecs import bits_f32

_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)


@njit(inline="always", cache=True, fastmath=True)
def exp32(x):
    """exp(x) for float32, ~1 ulp (Cephes expf polynomial); exp(-inf) = 0, clamps at 88.7."""
    tiny = x < np.float32(-87.33654)
    x = min(max(x, np.float32(-87.33654)), np.float32(88.72283))
    n = np.floor(x * _LOG2E + np.float32(0.5))
    r = x - n * _LN2_HI - n * _LN2_LO
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    y = p * bits_f32(np.int32(np.int32(n) + 127) << 23)
    return np.float32(0.0) if tiny else y
