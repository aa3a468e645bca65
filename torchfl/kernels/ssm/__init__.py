"""State-space family: ``selective_scan``, Mamba's selective scan (pure Python part).

A Mamba layer runs, per batch ``b`` and channel ``d``, a linear recurrence over time with a
state of ``N`` numbers (``N`` the SSM state size)::

    dt[t]   = softplus(delta[t] + delta_bias)        (each optional, as mamba_ssm's selective_scan_fn)
    h[t, n] = exp(dt[t] * A[d, n]) * h[t-1, n] + dt[t] * B[b, n, t] * u[t]      (h[-1] = 0)
    y[t]    = sum_n h[t, n] * C[b, n, t]  (+ D[d] * u[t])  (* silu(z[t]))

Inputs have transformers' / mamba_ssm's shapes: ``u``, ``delta``, ``z`` ``[B, D, L]``, ``A``
``[D, N]``, ``B`` and ``C`` ``[B, N, L]``, ``D`` and ``delta_bias`` ``[D]``; outputs ``y``
``[B, D, L]`` and the last state ``[B, D, N]`` (what a cache keeps for the next step), both
in ``u``'s dtype as mamba_ssm returns them; every input is read in its own dtype (the model
computes A, D and the bias in float32) and everything is computed in float32 on chip.

Tiling (``scan_tiling``): sequential over time, parallel over (batch, channel tile). A tile of
``TD`` channels keeps its state ``TD x N`` and ``A`` ``TD x N`` (float32) on chip for the whole
sequence and walks time in double-buffered chunks of ``TL`` steps (``u``, ``delta``, ``z``:
``TL x TD`` each, ``B``, ``C``: ``TL x N``, ``y``: ``TL x TD``). On one core the widest ``TD``
that fits is taken; on a chip of many cores (``concurrent_tiles``) the ``TD`` whose bytes, over
the share of cores its ``batch x ceil(D / TD)`` units keep busy, are fewest (narrower tiles
re-read B and C but fill the cores, as mamba_ssm's grid of (batch, channel block)). Off chip: ``u``, ``delta``,
``z``, ``y`` move once; ``B`` and ``C`` once per channel tile (``ceil(D / TD)`` times: once
when every channel fits, the largest ``TD`` that fits is taken); ``A``, ``D``, the bias once
per channel tile; the state never leaves the chip but its last value, written once.
Operations ``9 * B * L * D * N`` (exp, three multiplies for the discretisation and input,
multiply-add for the state, multiply-add for the output) plus the per-channel terms.
The same function prices the plan and drives execution (``impl.run_selective_scan``).
"""
from __future__ import annotations

import sys

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from ..tiling import TileConfig, Traffic, make_plan

ACC = 4                      # the state, A and the running values are float32 on chip
OPS_PER_STATE = 9            # per (b, d, t, n): see the module docstring
OPS_PER_CHANNEL = 12         # per (b, d, t): softplus(delta + bias) (~6), D * u + y, silu gate (~4)


def dims(p):
    """(Bt, D, L, N): batch, channels, time steps, state size."""
    (bt, d, l), n = p.shapes["u"], p.shapes["A"][1]
    return bt, d, l, n


def _check(p):
    s = p.shapes
    u = s["u"]
    if len(u) != 3:
        raise KernelError(f"selective_scan: u must be [batch, channels, length], got u{list(u)}")
    bt, d, l = u
    if len(s["A"]) != 2 or s["A"][0] != d:
        raise KernelError(f"selective_scan: A must be [channels={d}, state], got A{list(s['A'])}")
    n = s["A"][1]
    want = {"delta": (bt, d, l), "B": (bt, n, l), "C": (bt, n, l), "z": (bt, d, l), "D": (d,),
            "delta_bias": (d,)}
    for name, shape in want.items():
        if name in s and tuple(s[name]) != shape:
            raise KernelError(f"selective_scan: {name} must be {list(shape)} for u{list(u)} and A{list(s['A'])}, "
                              f"got {list(s[name])} (mamba_ssm's layout: B and C are [batch, state, length])")
    odd = {k: p.dtype_of(k) for k in s if p.dtype_of(k) not in FLOATS}
    if odd:
        raise KernelError(f"selective_scan: every input must be a float dtype, got {odd}; insert a cast")


def _meta(p):
    bt, d, l, n = dims(p)
    dt = p.dtype_of("u")
    return [TensorMeta((bt, d, l), dt, None), TensorMeta((bt, d, n), dt, None)]


def footprint(p, td, tl):
    """On-chip bytes of a (TD channels, TL steps) tile: state and A resident, chunks double-buffered."""
    _, _, _, n = dims(p)
    es = {k: ITEMSIZE[p.dtype_of(k)] for k in p.shapes}
    per_step = td * (es["u"] + es["delta"] + es.get("z", 0) + es["u"]) + n * (es["B"] + es["C"])
    per_chan = 2 * n * ACC + es.get("D", 0) + es.get("delta_bias", 0)
    return td * per_chan + 2 * tl * per_step


def traffic(p, td):
    """Off-chip bytes and operations of the whole scan with channel tiles of ``td``."""
    bt, d, l, n = dims(p)
    es = {k: ITEMSIZE[p.dtype_of(k)] for k in p.shapes}
    tiles = -(-d // td) if d else 0
    reads = bt * d * l * (es["u"] + es["delta"] + es.get("z", 0))
    reads += bt * tiles * n * l * (es["B"] + es["C"])
    reads += d * (n * es["A"] + es.get("D", 0) + es.get("delta_bias", 0))
    writes = bt * d * l * es["u"] + bt * d * n * es["u"]
    return Traffic(reads, writes, bt * d * l * (OPS_PER_STATE * n + OPS_PER_CHANNEL))


def scan_tiling(p, chip):
    """THE tiling function of the state-space family (see the module docstring)."""
    bt, d, l, n = dims(p)
    if bt * d * l == 0 or n == 0:
        t = Traffic(0, traffic(p, max(d, 1)).bytes_written, 0)     # zeros out, nothing read
        cfg = TileConfig("resident", (("channels", d), ("steps", l)), False, "empty scan: only zeros move")
        return make_plan(p.kernel, p.key, cfg, ((1, t),) if t.bytes else (), 0)
    cores = getattr(chip, "concurrent_tiles", 0)
    best = None
    for td in sorted({d} | {c for c in (256, 128, 64, 32, 16, 8, 4, 2, 1) if c < d}, reverse=True):
        tl = min(l, 64)
        while tl > 1 and footprint(p, td, tl) > chip.cache_bytes:
            tl //= 2
        if footprint(p, td, tl) > chip.cache_bytes:
            continue
        units = bt * -(-d // td)
        # bytes over the share of the chip's cores the (batch, channel tile) units keep busy
        score = traffic(p, td).bytes * (cores / min(units, cores) if cores else 1)
        if best is None or score < best[0]:
            best = (score, td, tl)
        if not cores:
            break        # one core: the widest tile that fits reads B and C the fewest times
    if best is None:
        raise KernelError(f"selective_scan: not even one channel with its {n}-number state fits the "
                          f"{chip.cache_bytes} B cache of {chip.name}")
    _, td, tl = best
    t = traffic(p, td)
    tiles = -(-d // td)
    bc = "once" if tiles == 1 else f"{tiles} times (once per channel tile)"
    notes = (f"sequential over {l} steps, parallel over {bt} x {tiles} (batch x channel tiles of {td}); "
             f"state {td}x{n} fp32 held on chip, never written but its last value; B and C read {bc}; "
             f"time in double-buffered chunks of {tl} steps")
    cfg = TileConfig("state_resident", (("channels", td), ("steps", tl), ("state", n)), True, notes,
                     parallel_units=bt * tiles)
    return make_plan(p.kernel, p.key, cfg, ((1, t),), footprint(p, td, tl))


if "torch" in sys.modules:       # torch.ops.torchfl.selective_scan, what transformers' Mamba is routed to
    from .torchop import register   # noqa: E402  (rule queries never import torch: see torchop)

    register()

KERNELS = [
    KernelSpec("selective_scan", "ssm", ("u", "delta", "A", "B", "C", "D?", "z?", "delta_bias?"),
               {"delta_softplus": False}, FLOATS,
               doc="Mamba's selective scan (mamba_ssm's selective_scan_fn): h = exp(dt*A)*h + dt*B*u, "
                   "y = C.h (+ D*u) (* silu(z)), dt = softplus(delta + delta_bias) when delta_softplus; "
                   "u, delta, z [B, D, L], A [D, N], B, C [B, N, L]; outputs y [B, D, L] and the last "
                   "state [B, D, N] in u's dtype, float32 on chip",
               check=_check, meta=_meta, tiler=scan_tiling, impl="run_selective_scan", mixed_dtypes=True,
               dtype_input="u"),
]
