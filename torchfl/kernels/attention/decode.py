"""Attention of a few queries over a long key/value cache (a decode step), on the host.

The tiled path (``impl.py``) converts every key and value into micro-kernel panels first, one
thread, at every call: for one query over a 4096-key cache that copy is most of the time, and a
decode step's cache is new at each token. Here each task is one key/value head of one batch
row with all the query rows that read it (its group's heads under grouped-query attention, x
Lq queries): every key row is decoded once as it streams past and scored against all of them,
then every value row is added into their accumulators, so K and V are each read once per
key/value head. Softmax is exact (max, then sum of exponentials), in float32; the result is
encoded once. The chip's schedule is the plan's: the loads and stores are counted from it
(``attention._schedule``), as the tiled path counts them.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..codecs import decode, encode16
from ..mathfn import exp32
from ..staging import load_row

DECODE_LQ = 4     # at most this many queries per head take this path

_FM = {"reassoc", "contract"}   # vectorised dot products and sums; inf/NaN kept (see impl._FM)


@njit(cache=True, fastmath=_FM)
def _dot(a, b):
    s = np.float32(0.0)
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


@njit(cache=True, fastmath=_FM)
def _axpy(acc, p, row):
    for i in range(acc.shape[0]):
        acc[i] += p * row[i]


@njit(cache=True)
def _masked(s, b, h, i, Lk, M, mst, mkind, code, causal):
    """Scores of query i of head h after the causal rule (key j visible iff j <= i) and the mask
    (bool: keep where set; float: added)."""
    for j in range(Lk):
        if causal and j > i:
            s[j] = -np.inf
        elif mkind != 0:
            mv = M[b * mst[0] + h * mst[1] + i * mst[2] + j * mst[3]]
            if mkind == 1:
                if mv == 0:
                    s[j] = -np.inf
            else:
                s[j] += decode(code, mv)


@njit(cache=True, fastmath=_FM)
def _softmax(s):
    """s = exp(s - max s) in place; returns the sum (0 when no key is visible)."""
    m = -np.inf
    for j in range(s.shape[0]):
        m = max(m, s[j])                 # a NaN score makes m NaN: the row is NaN, as torch's
    if m == -np.inf:                     # no visible key: weight 0 everywhere, the row 0 (torch's CPU)
        s[:] = 0.0
        return np.float32(0.0)
    tot = np.float32(0.0)
    for j in range(s.shape[0]):
        e = exp32(s[j] - m)
        s[j] = e
        tot += e
    return tot


@njit(cache=True, parallel=True)
def decode_attend(Q, qst, K, kst, V, vst, O, ost, M, mst, mkind, code, B, H, G, Lq, Lk, D, Dv, causal, scale):
    """O[b, h, i] = softmax(scale * q K^T (masked)) V for every query i < Lq of every head h; one
    task per (batch row, key/value head), its G query heads' Lq rows together."""
    hkv = H // G
    for t in prange(B * hkv):
        b, hk = np.int64(t) // hkv, np.int64(t) % hkv     # int64, not the prange index's uint64
        R = G * Lq
        q = np.empty(R * D, np.float32)
        s = np.empty(R * Lk, np.float32)
        acc = np.zeros(R * Dv, np.float32)
        row = np.empty(max(D, Dv), np.float32)
        for r in range(R):
            h, i = hk * G + r // Lq, r % Lq
            qr = q[r * D:(r + 1) * D]
            load_row(Q, b * qst[0] + h * qst[1] + i * qst[2], qst[3], D, code, qr)
            for d in range(D):
                qr[d] *= scale
        kb, vb = b * kst[0] + hk * kst[1], b * vst[0] + hk * vst[1]
        for j in range(Lk):                      # each key row once, scored against all R queries
            load_row(K, kb + j * kst[2], kst[3], D, code, row)
            kr = row[:D]
            for r in range(R):
                s[r * Lk + j] = _dot(q[r * D:(r + 1) * D], kr)
        tot = np.empty(R, np.float32)
        for r in range(R):
            sr = s[r * Lk:(r + 1) * Lk]
            _masked(sr, b, hk * G + r // Lq, r % Lq, Lk, M, mst, mkind, code, causal)
            tot[r] = _softmax(sr)
        for j in range(Lk):                      # each value row once, into all R accumulators
            load_row(V, vb + j * vst[2], vst[3], Dv, code, row)
            vr = row[:Dv]
            for r in range(R):
                p = s[r * Lk + j]
                if p != 0.0:
                    _axpy(acc[r * Dv:(r + 1) * Dv], p, vr)
        for r in range(R):
            h, i = hk * G + r // Lq, r % Lq
            inv = np.float32(1.0) / tot[r] if tot[r] != 0.0 else np.float32(0.0)
            base = b * ost[0] + h * ost[1] + i * ost[2]
            for d in range(Dv):
                v = acc[r * Dv + d] * inv
                if code == 0:
                    O[base + d * ost[3]] = v
                else:
                    O[base + d * ost[3]] = encode16(code, v)
