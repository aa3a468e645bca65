#!/usr/bin/env python
"""Measure this machine's fp32 FMA peak and memory bandwidth (the roof GEMM is judged by).

fp32 peak: the GEMM micro-kernel (kernels/ukernel.py's ukernel_gemm, LLVM IR) on
L1-resident packed panels, one instance per core (prange) -- the FMA rate the kernels
can actually issue. Bandwidth: a STREAM-style triad a = b + s*c over 3 x 64 MiB float64
arrays, counting 3 x 8 bytes per element (write-allocate traffic not counted).

    python tools/peak.py [--json] [--seconds 1.0]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from numba import get_num_threads, njit, prange  # noqa: E402

from torchfl.kernels.ukernel import MR, NR, ukernel_gemm  # noqa: E402

KC = 128


@njit(parallel=True, cache=True)
def _fma_burn(reps, nthreads):
    for t in prange(nthreads):
        pa = np.full(KC * MR, 1e-3, np.float32)
        pb = np.full(KC * NR, 1e-3, np.float32)
        c = np.zeros(MR * NR, np.float32)
        for _ in range(reps):
            ukernel_gemm(KC, pa, 0, KC, pb, 0, c, 0, NR, True, pb, 0, 0)


@njit(parallel=True, cache=True)
def _triad(a, b, c, s):
    for i in prange(a.shape[0]):
        a[i] = b[i] + s * c[i]


def fp32_peak(seconds=1.0):
    nt = get_num_threads()
    _fma_burn(10, nt)
    reps = 1000
    while True:
        t = time.perf_counter()
        _fma_burn(reps, nt)
        dt = time.perf_counter() - t
        if dt > seconds / 5:
            break
        reps *= 4
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        _fma_burn(reps, nt)
        dt = time.perf_counter() - t
        best = max(best, 2 * MR * NR * KC * reps * nt / dt)
    return best, nt


def bandwidth():
    n = 8 << 20   # 64 MiB per float64 array
    a, b, c = np.zeros(n), np.ones(n), np.ones(n)
    _triad(a, b, c, 3.0)
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        _triad(a, b, c, 3.0)
        ts.append(time.perf_counter() - t)
    return 3 * 8 * n / float(np.median(ts))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object")
    ap.add_argument("--seconds", type=float, default=1.0)
    a = ap.parse_args(argv)
    peak, nt = fp32_peak(a.seconds)
    bw = bandwidth()
    res = {"fp32_peak_gflops": round(peak / 1e9, 1), "threads": nt, "triad_gb_per_s": round(bw / 1e9, 1)}
    if a.json:
        print(json.dumps(res))
    else:
        print(f"fp32 FMA peak: {res['fp32_peak_gflops']} GFLOP/s on {nt} threads (micro-kernel, L1-resident)")
        print(f"memory bandwidth (triad): {res['triad_gb_per_s']} GB/s")
    return res


if __name__ == "__main__":
    main()
