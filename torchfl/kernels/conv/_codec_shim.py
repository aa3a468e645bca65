"""TEMPORARY scalar codecs until torchfl/kernels/codecs.py (core helper) lands."""
import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _h2f(h):
    h = np.uint32(h)
    s = (h & np.uint32(0x8000)) << np.uint32(16)
    e = (h >> np.uint32(10)) & np.uint32(0x1F)
    m = h & np.uint32(0x3FF)
    if e == 0:
        if m == 0:
            return np.array([s], dtype=np.uint32).view(np.float32)[0]
        v = np.float32(m) * np.float32(5.960464477539063e-08)
        return -v if s else v
    if e == 31:
        bits = s | np.uint32(0x7F800000) | (m << np.uint32(13))
    else:
        bits = s | ((e + np.uint32(112)) << np.uint32(23)) | (m << np.uint32(13))
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


@njit(cache=True, inline="always")
def decode_value(u, code):
    if code == 0 or code >= 4:
        return np.float32(u)
    if code == 1:
        return _h2f(u)
    bits = np.uint32(u) << np.uint32(16)
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


@njit(cache=True, inline="always")
def encode_value(v, code):
    v = np.float32(v)
    if code == 1:
        return np.float16(v).view(np.uint16) if False else _f2h(v)
    u = np.array([v], dtype=np.float32).view(np.uint32)[0]
    if v != v:
        return np.uint16((u >> np.uint32(16)) | np.uint32(0x40))
    return np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@njit(cache=True, inline="always")
def _f2h(v):
    u = np.array([v], dtype=np.float32).view(np.uint32)[0]
    s = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    if a >= np.uint32(0x7F800000):
        return np.uint16(s | np.uint32(0x7C00) | (np.uint32(0x200) if a > np.uint32(0x7F800000) else np.uint32(0)))
    if a >= np.uint32(0x477FF000):
        return np.uint16(s | np.uint32(0x7C00))
    if a < np.uint32(0x38800000):
        f = np.float32(np.array([a], dtype=np.uint32).view(np.float32)[0]) * np.float32(16777216.0)
        return np.uint16(s | np.uint32(np.rint(f)))
    r = a + np.uint32(0xFFF) + ((a >> np.uint32(13)) & np.uint32(1))
    return np.uint16(s | ((r - np.uint32(0x38000000)) >> np.uint32(13)))
