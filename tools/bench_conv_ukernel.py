"""The conv micro-kernel's block shapes side by side on one thread (GFLOP/s, best of 5 CPU
times): a tap-aware nest over ResNet-50-like shapes, operands hot in cache, so only the FMA
loop is measured (what an AVX-512 block would change).

    NUMBA_NUM_THREADS=1 python tools/bench_conv_ukernel.py [--json]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
from numba import njit

from torchfl.kernels.conv.microkernel import make_taps_kernel

SHAPES = {"6x16/8": (6, 16, 8), "6x16/16": (6, 16, 16), "12x16/16": (12, 16, 16), "14x16/16": (14, 16, 16),
          "8x32/16": (8, 32, 16), "8x48/16": (8, 48, 16), "12x32/16": (12, 32, 16)}
# name: (pixels, C, K, kernel rows: 1 = a 1x1 conv, 3 = a 3x3 conv's three row runs of 3C)
CASES = {"1x1 C64 K256 56x56": (3136, 64, 256, 1), "1x1 C256 K64 56x56": (3136, 256, 64, 1),
         "3x3 C64 K64 56x56": (3136, 64, 64, 3), "3x3 C256 K256 14x14": (196, 256, 256, 3),
         "3x3 C512 K512 7x7": (49, 512, 512, 3)}


def _driver(uk, mr, nr):
    @njit
    def drive(slab, pix, nmp, taps, nt, wpk, kc, npanel, acc):
        for mp in range(nmp):
            for p in range(npanel):
                for q in range(mr * nr):
                    acc[q] = 0.0
                uk(slab, pix, mp * mr, taps, nt, wpk, p * nt * kc * nr, kc, acc, 0, nr)
    return drive


def measure(shape, case):
    mr, nr, w = SHAPES[shape]
    M, C, K, T = CASES[case]
    nmp, npanel, kc = M // mr, -(-K // nr), C * (1 if T == 1 else 3)
    rng = np.random.default_rng(0)
    slab = rng.random(M * C + T * 64 * C + 4096, dtype=np.float32)
    pix = np.arange(M, dtype=np.int64) * C
    taps = np.arange(T, dtype=np.int64) * 58 * C
    wpk = rng.random(npanel * T * kc * nr, dtype=np.float32)
    acc = np.zeros(mr * nr, np.float32)
    d = _driver(make_taps_kernel(mr, nr, w), mr, nr)
    d(slab, pix, nmp, taps, T, wpk, kc, npanel, acc)
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        d(slab, pix, nmp, taps, T, wpk, kc, npanel, acc)
        best = min(best, time.process_time() - t0)
    return 2.0 * nmp * mr * npanel * nr * kc * T / best / 1e9      # the flops done, padding included


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = {case: {s: round(measure(s, case), 1) for s in SHAPES} for case in CASES}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        for case, r in res.items():
            print(f"{case:22s} " + "  ".join(f"{s} {v:6.1f}" for s, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
