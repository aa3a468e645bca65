"""Attention: scaled-dot-product attention, flash-style (online softmax), pure-Python part.

q[B,H,Lq,D], k[B,Hkv,Lk,D], v[B,Hkv,Lk,Dv] (grouped-query attention when Hkv < H: query
head h reads key/value head h // (H / Hkv) in place, as torch's enable_gqa), optional mask
(bool keep-mask or additive float, broadcastable to [B,H,Lq,Lk]), ``causal`` (key j visible to query i iff j <= i, like
torch's is_causal), ``scale`` (default 1/sqrt(D)).

``bshd``: q, k, v arrive stored [B, L, H, D] (a model's projection viewed per head, before the
transpose every attention makes) and the output is written [B, Lq, H, Dv] (as the transpose
back wants it): the rule pack's ``attention_bshd`` fusion folds those four transposes into the
kernel, which reads and writes rows of D (Dv) elements through the tensors' strides. The bytes
are those of the [B, H, L, D] call (one strided DMA row per key, query or output row, counted
at its size, as the layout family counts a strided gather); only the storage order differs.

Tiling (``plan_attention``), per head: Q tiles of Br rows, K/V tiles of Bc rows; for each
Q tile the needed K/V tiles are loaded (all of them; with causal, those starting at or
before the tile's last row), scores S (Br x Bc, fp32), running max/sum and the fp32
output accumulator stay on chip; O is stored once per Q tile. Bytes per head:

    Q + O + (#K/V tiles loaded) x Bc x (D + Dv) x es + mask elements of loaded tiles

``kv_resident``: K and V of a head fit beside the stream and are loaded once per head.
``resident``: everything fits at once. Candidates that fit the cache are scored by
bytes, then tile count; a bigger cache only adds candidates, so bytes never grow.
Grouped-query attention: where K/V stay resident (``kv_resident``, ``resident``) they are
loaded once per key/value head, its group's query heads running in turn; streamed K/V
tiles are loaded per query head, as after repeat_kv.
"""
from __future__ import annotations

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..tiling import TileConfig, Traffic, make_plan

SOFTMAX_OPS = 5   # scale/mask, max, exp, sum, rescale per score


def heads_second(shape, bshd: bool) -> tuple:
    """A q/k/v/output shape as [B, H, L, D]: a ``bshd`` tensor's [B, L, H, D] with L and H swapped."""
    return (shape[0], shape[2], shape[1], shape[3]) if bshd else tuple(shape)


def dims(p):
    bshd = bool(p.attrs.get("bshd"))
    q, k, v = (p.shapes[n] for n in ("q", "k", "v"))
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        order = "[B, L, H, D] (bshd)" if bshd else "[B, H, L, D]"
        raise KernelError(f"attention: q, k, v must be {order}; got {list(q)}, {list(k)}, {list(v)}")
    q, k, v = (heads_second(t, bshd) for t in (q, k, v))
    B, H, Lq, D = q
    if k[0] != B or v[:2] != k[:2] or k[3] != D or v[2] != k[2]:
        raise KernelError(f"attention: shapes do not agree: q{list(q)} k{list(k)} v{list(v)} "
                          "(need k [B,Hkv,Lk,D] and v [B,Hkv,Lk,Dv])")
    if k[1] == 0 or H % k[1]:
        raise KernelError(f"attention: {H} query heads cannot be grouped over {k[1]} key/value heads "
                          "(grouped-query attention needs the query heads a multiple of the key/value heads)")
    return B, H, Lq, k[2], D, v[3]


def kv_heads(p) -> int:
    """Key/value heads (H for plain attention, fewer for grouped-query attention)."""
    return p.shapes["k"][2 if p.attrs.get("bshd") else 1]


def _check(p):
    B, H, Lq, Lk, D, Dv = dims(p)
    for n in ("q", "k", "v"):
        if p.dtype_of(n) != p.dtype:
            raise KernelError(f"attention: {n} must be {p.dtype}, got {p.dtype_of(n)}; insert a cast")
    if "mask" in p.shapes:
        m = p.shapes["mask"]
        if len(m) > 4 or any(a not in (1, b) for a, b in zip((1,) * (4 - len(m)) + tuple(m), (B, H, Lq, Lk))):
            raise KernelError(f"attention: mask {list(m)} does not broadcast to [{B}, {H}, {Lq}, {Lk}]")
        if p.dtype_of("mask") not in ("bool", p.dtype):
            raise KernelError(f"attention: mask must be bool or {p.dtype}, got {p.dtype_of('mask')}")
        if p.attrs["causal"]:
            raise KernelError("attention: give either a mask or causal=True, not both (as torch)")


def _meta(p):
    B, H, Lq, Lk, D, Dv = dims(p)
    return [TensorMeta(heads_second((B, H, Lq, Dv), bool(p.attrs.get("bshd"))), p.dtype, None)]


def _cands(n, lo=16):
    c = {n}
    t = lo
    while t < n:
        c.add(t)
        t *= 2
    return sorted(c)


def k_tiles_needed(i0, tq, Lk, Bc, causal):
    """Number of K tiles a Q tile [i0, i0+tq) loads."""
    if not causal:
        return -(-Lk // Bc)
    last = min(i0 + tq - 1, Lk - 1)
    return last // Bc + 1 if last >= 0 else 0


def k_tile_sizes(i0, tq, Lk, Bc, causal):
    n = k_tiles_needed(i0, tq, Lk, Bc, causal)
    return [min(Bc, Lk - j * Bc) for j in range(n)]


def _schedule(Lq, Lk, D, Dv, es, esm, causal, heads, kvh, Br, Bc, kv_once):
    """Per-Q-tile traffic groups of every head (K/V loaded once per key/value head when
    ``kv_once``): what the plan of ``plan_attention``'s choice moves."""
    groups = {}
    for i0 in range(0, Lq, Br):
        tq = min(Br, Lq - i0)
        ks = k_tile_sizes(i0, tq, Lk, Bc, causal)
        kv = 0 if kv_once else sum(ks) * (D + Dv) * es
        mk = sum(ks) * tq * esm
        fl = sum(ks) * tq * (2 * D + 2 * Dv + SOFTMAX_OPS)
        t = Traffic(tq * D * es + kv + mk, tq * Dv * es, fl)
        groups[t] = groups.get(t, 0) + heads
    out = [(c, t) for t, c in groups.items()]
    if kv_once:
        out.append((kvh, Traffic(Lk * (D + Dv) * es, 0, 0)))
    return out


def plan_attention(p, chip):
    """THE tiling function of attention (see the module docstring)."""
    B, H, Lq, Lk, D, Dv = dims(p)
    es = ITEMSIZE[p.dtype]
    causal = bool(p.attrs["causal"])
    has_mask = "mask" in p.shapes
    esm = ITEMSIZE[p.dtype_of("mask")] if has_mask else 0
    heads = B * H
    kvh = B * kv_heads(p)   # K/V loaded once per head are loaded once per group: the group's heads run in turn
    cache = chip.cache_bytes
    key = p.key
    if heads == 0 or Lq == 0 or Dv == 0:
        return make_plan(p.kernel, key, TileConfig("resident", (("q", Lq), ("k", Lk)), False, "empty"), (), 0)

    best = None

    def total_bytes(Br, Bc, kv_once):
        """Bytes of schedule(Br, Bc, kv_once) without building it (the tiler scores many)."""
        nfull, rest = divmod(Lq, Br)
        if not causal:
            keys = Lk * (nfull + (1 if rest else 0))
            mk = Lk * Lq * esm
        else:
            keys = mk = 0
            for i0 in range(0, Lq, Br):
                tq = min(Br, Lq - i0)
                last = min(i0 + tq - 1, Lk - 1)
                kk = min(Lk, (last // Bc + 1) * Bc) if last >= 0 else 0
                keys += kk
                mk += kk * tq * esm
        per_head = Lq * D * es + Lq * Dv * es + mk + (0 if kv_once else keys * (D + Dv) * es)
        return heads * per_head + (kvh * Lk * (D + Dv) * es if kv_once else 0)

    def consider(strategy, Br, Bc, kv_once, fp):
        nonlocal best
        if fp > cache:
            return
        total = total_bytes(Br, Bc, kv_once)
        ntiles = heads * (-(-Lq // Br)) * (1 if kv_once else -(-max(Lk, 1) // Bc))
        rank = {"resident": 0, "kv_resident": 1, "streamed": 2}[strategy]
        score = (total, ntiles, rank)
        if best is None or score < best[0]:
            best = (score, strategy, Br, Bc, kv_once, None, fp)

    Lk1 = max(Lk, 1)
    acc = 4
    # resident: all heads at once
    fp_res = heads * ((Lq * D + Lk * (D + Dv) + Lq * Dv) * es + Lq * Lk1 * (acc + esm) + Lq * (Dv + 2) * acc)
    consider("resident", Lq, Lk1, True, fp_res)
    for Br in _cands(Lq, 8):
        # kv_resident: one head's K, V loaded once; Q tiles double-buffered
        fp = Lk * (D + Dv) * es + 2 * Br * D * es + Br * Lk1 * (acc + 2 * esm) + Br * (Dv + 2) * acc + 2 * Br * Dv * es
        consider("kv_resident", Br, Lk1, True, fp)
        for Bc in _cands(Lk1, 16):
            fp = (2 * Br * D * es + 2 * Bc * (D + Dv) * es + Br * Bc * (acc + 2 * esm)
                  + Br * (Dv + 2) * acc + 2 * Br * Dv * es)
            consider("streamed", Br, Bc, False, fp)
    if best is None:
        raise KernelError(f"attention: no tile of D={D}, Dv={Dv} fits the {cache} B cache of {chip.name}")
    _, strategy, Br, Bc, kv_once, _, fp = best
    groups = _schedule(Lq, Lk, D, Dv, es, esm, causal, heads, kvh, Br, Bc, kv_once)
    assert sum(c * t.bytes for c, t in groups) == best[0][0]
    notes = {"resident": "all heads' q, k, v fit the cache: each loaded once",
             "kv_resident": f"each head's K and V loaded once; Q tiles of {Br} double-buffered",
             "streamed": f"Q tiles of {Br}, K/V tiles of {Bc} double-buffered, online softmax"}[strategy]
    if p.attrs.get("bshd"):
        notes += (f"; q, k, v read and O written in [B, L, H, D] storage: strided rows of {D * es} B "
                  "(the transposes around attention folded in)")
    cfg = TileConfig(strategy, (("q", Br), ("k", Bc), ("kv_once", int(kv_once))), strategy != "resident", notes)
    return make_plan(p.kernel, key, cfg, groups, fp)


KERNELS = [KernelSpec(
    name="attention", family="attention", inputs=("q", "k", "v", "mask?"),
    attrs={"causal": False, "scale": None, "bshd": False}, dtypes=FLOATS, layouts="any",
    fuses=("aten.scaled_dot_product_attention",),
    doc="softmax(q k^T * scale + mask) v, flash-style tiles with an online softmax",
    check=_check, meta=_meta, tiler=plan_attention, impl="run_attention", mixed_dtypes=True,
    dtype_input="q")]
