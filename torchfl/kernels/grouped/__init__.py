"""Grouped GEMM family: ``grouped_mm`` (pure Python part).

A mixture-of-experts layer multiplies each expert's tokens by that expert's weight. Sorted
by expert, the tokens form one matrix ``x[S, K]`` whose rows ``offs[e-1]:offs[e]`` belong to
expert ``e`` (``offs`` the cumulative token counts, int32 or int64, known only at run time:
the routing computes them); the weights are one tensor ``w[E, K, N]``. ``out[r] = x[r] @
w[e(r)]`` (``w_nk``: w stored ``[E, N, K]``, each expert's weight used transposed, as
transformers' experts keep them; read in place); rows from ``offs[-1]`` on belong to no expert and are zeros (transformers'
``grouped_mm_fallback`` starts from zeros; ``torch._grouped_mm`` leaves them undefined).
Accumulation in float32, one rounding to the output dtype, as a GEMM.

Tiling (``grouped_tiling``): one kernel over every expert, each expert's rows a GEMM of its
own, output-stationary: ``TM x TN`` fp32 accumulator tiles, K walked in ``TK`` tiles, A and B
tiles double-buffered. An expert with ``m_e`` tokens reads its weight ``ceil(m_e / TM)``
times (once when its tokens fit one row tile: every decode step), its rows ``ceil(N / TN)``
times; an expert with no token reads nothing. The total weight passes ``R = sum_e ceil(m_e /
TM)`` depend on the routing: from ``ceil(S / TM)`` (every token on one expert) to ``a +
floor((S - a) / TM)``, ``a = min(E, S)`` (every expert busy, one token each, the rest in whole
row tiles). The plan is priced at the upper end (a bound: what the routing can make it
cost) and its notes give the range; the run counts what it moved (equal to the plan in that
worst case). Everything else is routing-independent: rows ``S*K`` times ``ceil(N/TN)``,
output ``S*N`` once, ``2*S*K*N`` operations, the offsets once.

Against per-expert GEMMs (transformers' loop: one ``mm`` launch per expert with tokens, each
streaming its weight the same way), the grouped kernel moves the same bytes and saves the
launches: ``E - 1`` of them at most. A captured ``torch._grouped_mm`` offers no other choice
(the per-expert split needs the run-time offsets), so core's decomposition maps it here
(through ``torch.ops.torchfl.grouped_mm``, module ``torchop``);
tools/bench_kernels.py compares both.
"""
from __future__ import annotations

import sys

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..matmul import _cands, _cdiv     # each expert's GEMM takes the GEMM's tile candidates
from ..spec import KernelSpec, TensorMeta
from ..tiling import TileConfig, Traffic, make_plan

ACC = 4                      # fp32 accumulator on chip
IDS = ("int32", "int64")


def dims(p):
    """(S, K, N, E) of a problem (``w_nk``: w stored as [E, N, K], the weight a GEMM transposes)."""
    (S, K), w = p.shapes["x"], p.shapes["w"]
    return S, K, (w[1] if p.attrs["w_nk"] else w[2]), w[0]


def _check(p):
    x, w, offs = p.shapes["x"], p.shapes["w"], p.shapes["offs"]
    if len(x) != 2 or len(w) != 3 or len(offs) != 1:
        raise KernelError(f"grouped_mm: expects x[S,K], w[E,K,N], offs[E]; got x{list(x)} w{list(w)} "
                          f"offs{list(offs)}")
    wk = w[2] if p.attrs["w_nk"] else w[1]
    if x[1] != wk:
        raise KernelError(f"grouped_mm: x has K={x[1]} but w has K={wk} (w is "
                          f"{'[E, N, K]: w_nk' if p.attrs['w_nk'] else '[E, K, N]'})")
    if offs[0] != w[0]:
        raise KernelError(f"grouped_mm: offs has {offs[0]} entries for {w[0]} experts (one cumulative count each)")
    if p.dtype_of("x") != p.dtype_of("w") or p.dtype_of("x") not in FLOATS:
        raise KernelError(f"grouped_mm: x and w must share one float dtype, got {p.dtype_of('x')} and "
                          f"{p.dtype_of('w')}; insert a cast")
    if p.dtype_of("offs") not in IDS:
        raise KernelError(f"grouped_mm: offs must be int32 or int64, got {p.dtype_of('offs')}")


def _meta(p):
    S, _, N, _ = dims(p)
    return [TensorMeta((S, N), p.dtype_of("x"), None)]


def weight_passes(S, E, tm):
    """(fewest, most) weight passes ``sum_e ceil(m_e / tm)`` over every routing of S rows to E experts."""
    if S == 0 or E == 0:
        return 0, 0
    a = min(E, S)
    return _cdiv(S, tm), a + (S - a) // tm


def traffic(p, tm, tn, passes):
    """Off-chip bytes and operations for ``passes`` weight passes (the one routing-dependent term)."""
    S, K, N, E = dims(p)
    es, ei = ITEMSIZE[p.dtype_of("x")], ITEMSIZE[p.dtype_of("offs")]
    reads = E * ei + S * K * es * _cdiv(N, tn) + passes * K * N * es
    return Traffic(reads, S * N * es, 2 * S * K * N)


def footprint(tm, tn, tk, es):
    return 2 * (tm * tk + tk * tn) * es + tm * tn * ACC


def grouped_tiling(p, chip):
    """THE tiling function of the grouped family (see the module docstring)."""
    S, K, N, E = dims(p)
    es = ITEMSIZE[p.dtype_of("x")]
    if S == 0 or N == 0 or K == 0:
        t = Traffic(E * ITEMSIZE[p.dtype_of("offs")] if S * N else 0, S * N * es, 0)
        cfg = TileConfig("resident", (("m", S), ("n", N), ("k", K)), False,
                         "degenerate grouped GEMM: only the output (zeros) moves")
        return make_plan(p.kernel, p.key, cfg, ((1, t),) if t.bytes else (), 0)
    best = None
    for tk in _cands(K):
        for tn in _cands(N):
            room = chip.cache_bytes - 2 * tk * tn * es
            per = 2 * tk * es + tn * ACC
            if room < per:
                continue
            tm = min(S, room // per)
            lo, hi = weight_passes(S, E, tm)
            worst = traffic(p, tm, tn, hi)
            score = (worst.bytes, hi * _cdiv(N, tn) * _cdiv(K, tk))
            if best is None or score < best[0]:
                best = (score, tm, tn, tk, lo, hi)
    if best is None:
        raise KernelError(f"grouped_mm: no tile of K={K} N={N} ({p.dtype_of('x')}) fits the {chip.cache_bytes} B "
                          f"cache of {chip.name}: even an 8x8 tile needs more")
    _, tm, tn, tk, lo, hi = best
    t_lo, t_hi = traffic(p, tm, tn, lo), traffic(p, tm, tn, hi)
    once = "once" if tm >= S else f"once per {tm} of its tokens"
    notes = (f"tokens per expert from the routing at run time (offs): 0..{S} each, {S} in all; each expert's "
             f"weight streamed {once}; weight passes {lo}..{hi} over the routings, bytes "
             f"{t_lo.bytes}..{t_hi.bytes}, priced at {hi} (the bound); {tm}x{tn} fp32 accumulator, K tiles of {tk}")
    # one group per output tile pass: the bound's weight passes, each over N/TN column tiles
    cfg = TileConfig("streamed", (("m", tm), ("n", tn), ("k", tk), ("weight_passes_min", lo),
                                  ("weight_passes_max", hi)), True, notes, grid=(1, S, N, K))
    return make_plan(p.kernel, p.key, cfg, ((1, t_hi),), footprint(tm, tn, tk, es))


if "torch" in sys.modules:       # torch.ops.torchfl.grouped_mm, the target of core's decomposition
    from .torchop import register   # noqa: E402  (rule queries never import torch: see torchop)

    register()

KERNELS = [
    KernelSpec("grouped_mm", "grouped", ("x", "w", "offs"), {"w_nk": False}, FLOATS,
               doc="out[r] = x[r] @ w[e] for the rows offs[e-1]:offs[e] of expert e (offs: cumulative token "
                   "counts, a run-time input); rows from offs[-1] on are zeros; fp32 accumulation; w_nk: w "
                   "stored [E, N, K] and used transposed (transformers' expert weights), read in place",
               check=_check, meta=_meta, tiler=grouped_tiling, impl="run_grouped_mm", mixed_dtypes=True,
               dtype_input="x"),
]
