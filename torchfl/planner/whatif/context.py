"""Decoders: the KV cache and the context. The longest context whose decode step fits a chip,
and the largest batch at a context, by planning the decode step (captured once per batch
regime with the context symbolic) at a few sizes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
import time

from torchfl.planner.whatif.batch import MaxBatch, Probe, limit_of
from torchfl.planner.whatif.planning import Planned, auto_precision, plan_on


class Decoder:
    """A causal LM prepared for what-if planning (``planner.lm``): its cache layout and its
    decode step captured once per batch regime with the context (and batch) symbolic, so a
    probe at another context or batch is a specialisation and a plan, not a new capture."""

    def __init__(self, lm):
        from torchfl.planner.lm import cache_spec

        self.lm = lm
        self.spec = cache_spec(lm)
        self.max_positions = _max_positions(lm)
        self._symbolic: dict = {}

    def step_inputs(self, batch: int, context: int, meta: bool = True):
        """The decode step's inputs at (batch, context): meta tensors unless ``meta=False``."""
        import torch

        from torchfl.planner.lm import decode_inputs

        _step, inputs = decode_inputs(self.lm, batch, context, self.spec)
        if meta:
            inputs = tuple(torch.empty(x.shape, dtype=x.dtype, device="meta") for x in inputs)
        return inputs

    def captured(self, batch: int, context: int):
        """(Captured decode step at (batch, context), its inputs), cache inputs named per layer."""
        from torchfl.planner.capture import capture_module
        from torchfl.planner.lengths import specialise
        from torchfl.planner.lm import decode_inputs, rename_cache_inputs

        inputs = self.step_inputs(batch, context)
        sym = self._symbolic_for(batch)
        if sym is not None:
            bind = sym.bindings(inputs)
            if sym.admits(bind):
                return specialise(sym, inputs), inputs
        step, real = decode_inputs(self.lm, batch, context, self.spec)
        return rename_cache_inputs(capture_module(step, real), self.spec.layers), inputs

    def _symbolic_for(self, batch: int):
        """The symbolic capture for batch 1 (batch fixed) or batch >= 2 (batch symbolic too):
        torch.export specialises a size of 1."""
        from torch.export import Dim

        from torchfl.planner.lengths import capture_symbolic
        from torchfl.planner.lm import decode_inputs, rename_cache_inputs

        key = batch == 1
        if key not in self._symbolic:
            b = 1 if key else 2
            step, inputs = decode_inputs(self.lm, b, 17, self.spec)
            bdim = {} if key else {0: Dim.AUTO}
            shapes = (bdim or None, tuple({**bdim, 2: Dim.AUTO} for _ in inputs[1:]))
            sym = capture_symbolic(step, inputs, shapes)
            if sym is not None:
                rename_cache_inputs(sym.captured, self.spec.layers)
            self._symbolic[key] = sym
        return self._symbolic[key]

    def cache_bytes(self, batch: int, context: int) -> int:
        return self.spec.nbytes(batch, context)


def _max_positions(lm) -> int | None:
    """The longest sequence the model's position encoding takes (its config), if it says."""
    cfg = getattr(lm, "config", None)
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def plan_decode(chip, dec: Decoder, batch: int, context: int, precision="auto") -> Planned:
    """The decode step of ``dec`` at (batch, context) planned on ``chip`` (errors kept)."""
    captured, inputs = dec.captured(batch, context)
    return plan_on(chip, captured, inputs, precision)


@dataclass
class MaxContext:
    chip: str
    version: str
    precision: str | None
    batch: int
    context: int
    limit: str
    reason: str
    capacity_bytes: int | None
    peak_bytes: int | None
    kv_cache_bytes: int | None
    probes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["probes"] = [asdict(p) for p in sorted(self.probes, key=lambda p: p.batch)]
        return d


def _probe_of(p: Planned, at: int, seconds: float) -> Probe:
    if p.ok:
        return Probe(at, True, p.peak_bytes, seconds=seconds)
    mp = getattr(p.error, "memory", None)
    peak = p.error.value if limit_of(p.error) == "memory" else (None if mp is None else mp.peak_bytes)
    return Probe(at, False, peak, limit_of(p.error), str(p.error), seconds)


def _search(probe, lo_start: int, upper: int, cap) -> tuple[int, Probe | None]:
    """The largest x in [lo_start, upper] whose probe fits (probes fit up to some x, then not):
    two probes, the x a straight line through their peaks predicts, then doubling steps and
    bisection. Returns (x, the refusing probe just above it, or None when ``upper`` fits);
    x = lo_start - 1 when even ``lo_start`` is refused."""
    p1 = probe(lo_start)
    if not p1.ok:
        return lo_start - 1, p1
    if upper <= lo_start:
        return lo_start, None
    second = min(upper, max(lo_start + 1, 2 * lo_start))
    p2 = probe(second)
    if not p2.ok:
        lo, hi = lo_start, second
    else:
        lo, hi = second, None
        slope = (p2.peak_bytes or 0) - (p1.peak_bytes or 0)
        if cap is None or slope <= 0:
            guess = upper
        else:
            guess = lo_start + (cap - p1.peak_bytes) * (second - lo_start) // slope
        guess = max(lo + 1, min(upper, int(guess)))
        if guess > lo:
            if probe(guess).ok:
                lo = guess
            else:
                hi = guess
        step = max(1, lo // 64)
        while hi is None and lo < upper:
            x = min(upper, lo + step)
            if probe(x).ok:
                lo, step = x, step * 2
            else:
                hi = x
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if probe(mid).ok:
            lo = mid
        else:
            hi = mid
    return lo, (probe(hi) if hi is not None else None)


def max_context(lm, chip, batch: int = 1, precision="auto", progress=None, dec: Decoder | None = None) -> MaxContext:
    """The longest context (cached positions after a decode step) whose decode step fits
    ``chip`` at ``batch``, by planning (nothing runs): limited by the off-chip memory (the KV
    cache grows with the context), the chip's sequence limits, or the model's positions."""
    dec = dec or Decoder(lm)
    prec = auto_precision(chip.hcd, precision)
    upper = dec.max_positions or int(chip.hcd.constraints.max_sequence_length)
    probes: dict[int, Probe] = {}

    def probe(n: int) -> Probe:
        if n not in probes:
            t0 = time.perf_counter()
            p = plan_decode(chip, dec, batch, n, prec)
            probes[n] = pr = _probe_of(p, n, time.perf_counter() - t0)
            if progress is not None:
                progress(pr)
        return probes[n]

    best, fail = _search(probe, min(64, upper), upper, chip.model.memory_bytes)
    if best < min(64, upper) and upper > 3:     # below the first probe: search the short contexts
        best, fail = _search(probe, 3, min(64, upper) - 1, chip.model.memory_bytes)
    if best < 3:      # not even the shortest context probed fits
        best = 0
    if fail is None:
        limit = "model positions" if dec.max_positions and best == dec.max_positions else "sequence length"
        reason = (f"the model's config takes at most {best} positions (max_position_embeddings); the decode step at "
                  "that context fits" if limit == "model positions" else
                  f"constraints.max_sequence_length is {best}; the decode step at that context fits")
    else:
        limit, reason = fail.limit, fail.error
    peak = probes[best].peak_bytes if best in probes else None
    return MaxContext(chip.name, chip.version, prec, batch, best, limit, reason, chip.model.memory_bytes,
                      peak, dec.cache_bytes(batch, best) if best > 0 else None, list(probes.values()))


def max_batch_at_context(lm, chip, context: int, precision="auto", progress=None,
                         dec: Decoder | None = None) -> MaxBatch:
    """The largest batch whose decode step at ``context`` fits ``chip`` (max_batch's answer for
    a decoder: the KV cache grows with the batch)."""
    dec = dec or Decoder(lm)
    prec = auto_precision(chip.hcd, precision)
    limit_max = int(chip.hcd.constraints.max_batch_size)
    probes: dict[int, Probe] = {}

    def probe(b: int) -> Probe:
        if b not in probes:
            t0 = time.perf_counter()
            p = plan_decode(chip, dec, b, context, prec)
            probes[b] = pr = _probe_of(p, b, time.perf_counter() - t0)
            if progress is not None:
                progress(pr)
        return probes[b]

    best, fail = _search(probe, 1, limit_max, chip.model.memory_bytes)
    if fail is None:
        limit, reason = "max_batch_size", (f"constraints.max_batch_size is {limit_max}; the decode step at that batch "
                                           f"and context {context} fits the memory")
    else:
        limit, reason = fail.limit, fail.error
    peak = probes[best].peak_bytes if best in probes else None
    return MaxBatch(chip.name, chip.version, prec, False, max(best, 0), limit, reason, chip.model.memory_bytes,
                    limit_max, peak, list(probes.values()))
