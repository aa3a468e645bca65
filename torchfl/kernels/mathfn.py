"""Branch-free float32 math that LLVM vectorises (Numba's math.exp is a scalar libm call:
without SVML, exp-bound loops run ~10x slower than torch's vectorised exp). They stay
``inline="always"``: left to LLVM's inliner, tanh32 stayed a call inside GPT-2's
elementwise loop and its tanh step went from 1.2 to 5.2 ms (codecs.py says why the
decoders are the opposite case)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .codecs import bits_f32

_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)
_LN2_LO = np.float32(-2.12194440e-4)


@njit(inline="always", cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def exp32(x):
    """exp(x) for float32, ~1 ulp (Cephes expf polynomial); exp(-inf) = 0, clamps at 88.7;
    exp(NaN) = NaN (a select, so loops still vectorise)."""
    x0 = x
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
    return np.float32(0.0) if tiny else (y if x0 == x0 else x0)


@njit(inline="always", cache=True)
def tanh32(x):
    """tanh(x) for float32, branch-free so loops vectorise (``math.tanh`` is a scalar libm
    call, ~10x slower): sign(x)(1-e)/(1+e) with e = exp(-2|x|); below |x| = 1/16 the odd
    Taylor series to x^7 instead, which avoids the cancellation in 1-e (relative error
    ~1e-7 there, absolute ~2e-7 elsewhere). tanh(+-inf) = +-1, tanh(nan) = nan."""
    a = abs(x)
    e = exp32(np.float32(-2.0) * a)
    big = (np.float32(1.0) - e) / (np.float32(1.0) + e)
    q = a * a
    small = a * (np.float32(1.0) + q * (np.float32(-1.0 / 3.0) + q * (np.float32(2.0 / 15.0)
                                                                    + q * np.float32(-17.0 / 315.0))))
    t = small if a < np.float32(0.0625) else big
    t = t if x >= np.float32(0.0) else -t
    return x if x != x else t


@njit(inline="always", cache=True)
def erf32(x):
    """erf(x) for float32, branch-free (``math.erf`` is a scalar libm call): Abramowitz &
    Stegun 7.1.26, 1 - poly(t) exp(-x^2) with t = 1/(1 + 0.3275911|x|), absolute error
    <= 1.5e-7 (well inside the float32 tolerance of 1e-5 absolute); odd in x."""
    a = abs(x)
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * a)
    p = np.float32(1.061405429)
    p = p * t + np.float32(-1.453152027)
    p = p * t + np.float32(1.421413741)
    p = p * t + np.float32(-0.284496736)
    p = p * t + np.float32(0.254829592)
    r = np.float32(1.0) - p * t * exp32(-a * a)
    r = r if x >= np.float32(0.0) else -r
    return x if x != x else r


@njit(inline="always", cache=True)
def gelu_erf32(v):
    """GELU of a float32 ``v``, erf form: 0.5 v (1 + erf(v/sqrt 2)). One entry point per form:
    a caller that knows its form (a GEMM epilogue's GELU wrapper) copies only that form's
    chain into its IR (``gelu32(v, False)`` copied and typed the tanh chain too: 0.4-1.1 s of
    compile CPU per caller)."""
    return np.float32(0.5) * v * (np.float32(1.0) + erf32(v * np.float32(0.7071067811865476)))


@njit(inline="always", cache=True)
def gelu_tanh32(v):
    """GELU of a float32 ``v``, torch's tanh approximation (see :func:`gelu_erf32`)."""
    return np.float32(0.5) * v * (np.float32(1.0) + tanh32(np.float32(0.7978845608028654)
                                                          * (v + np.float32(0.044715) * v * v * v)))


@njit(inline="always", cache=True)
def gelu32(v, tanh_form):
    """GELU of a float32 ``v``: 0.5 v (1 + erf(v/sqrt 2)), or torch's tanh approximation,
    on erf32/tanh32 so elementwise loops and GEMM epilogues vectorise (abs. error ~3e-7 |v|).
    For callers whose form is a run-time value; one that knows it calls
    :func:`gelu_erf32` / :func:`gelu_tanh32`."""
    if tanh_form:
        return gelu_tanh32(v)
    return gelu_erf32(v)
