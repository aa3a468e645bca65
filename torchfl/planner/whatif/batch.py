"""The largest batch whose plan fits a chip (memory, ``max_batch_size``, sequence length),
found by planning at a few batches, never by running."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
import time

from torchfl.planner.whatif.planning import auto_precision, capture, plan_on


LIMIT_FIELDS = {
    "memory.off_chip_memory.size_gb": "memory",
    "constraints.max_batch_size": "max_batch_size",
    "constraints.max_sequence_length": "sequence length",
    "compute_units.attention.max_sequence_length": "sequence length",
}


def batched(inputs, batch: int):
    """The example inputs at another batch: every tensor repeated along dim 0 from its
    first sample (the batch is the first dimension of every tensor input)."""
    import torch

    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dim() >= 1:
            first = x[:1]
            x = first.repeat(batch, *([1] * (x.dim() - 1))).contiguous(
                memory_format=torch.channels_last if _channels_last(x) else torch.contiguous_format)
        out.append(x)
    return tuple(out)


def _channels_last(x) -> bool:
    import torch

    return x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


@dataclass(frozen=True)
class Probe:
    """One planning at ``batch``: fits or not, the peak, and the limit that refused it."""

    batch: int
    ok: bool
    peak_bytes: int | None
    limit: str = ""
    error: str = ""
    seconds: float = 0.0


@dataclass
class MaxBatch:
    chip: str
    version: str
    precision: str | None
    training: bool
    batch: int
    limit: str
    reason: str
    capacity_bytes: int | None
    max_batch_size: int
    peak_bytes: int | None
    probes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["probes"] = [asdict(p) for p in sorted(self.probes, key=lambda p: p.batch)]
        return d


def limit_of(exc) -> str:
    f = getattr(exc, "field", None)
    return LIMIT_FIELDS.get(f, f or type(exc).__name__)


def max_batch(module, inputs, chip, precision="auto", training=False, progress=None) -> MaxBatch:
    """The largest batch whose plan fits ``chip``, by planning: at 1 and 2, then at the
    batch a straight line through their peaks predicts, then up or down (doubling steps,
    then bisection) until a batch that fits sits next to one that does not or at the
    chip's ``max_batch_size``. Each probe re-captures the model at that batch."""
    prec = auto_precision(chip.hcd, precision)
    limit_max = int(chip.hcd.constraints.max_batch_size)
    cap = chip.model.memory_bytes
    probes: dict[int, Probe] = {}

    def probe(b: int) -> Probe:
        if b in probes:
            return probes[b]
        t0 = time.perf_counter()
        x = batched(inputs, b)
        fw, bw = capture(module, x, training, chip.packs)
        p = plan_on(chip, fw, x if not training else (), prec, bw)
        del x
        if p.ok:
            pr = Probe(b, True, p.peak_bytes, seconds=time.perf_counter() - t0)
        else:
            mp = getattr(p.error, "memory", None)
            peak = p.error.value if limit_of(p.error) == "memory" else (None if mp is None else mp.peak_bytes)
            pr = Probe(b, False, peak, limit_of(p.error), str(p.error), time.perf_counter() - t0)
        probes[b] = pr
        if progress is not None:
            progress(pr)
        return pr

    def result(best: int, fail: Probe | None) -> MaxBatch:
        if fail is None:   # best == max_batch_size and it fits
            limit, reason = "max_batch_size", (f"constraints.max_batch_size is {limit_max}; the plan at that batch "
                                               "fits the memory")
        else:
            limit, reason = fail.limit, fail.error
        peak = probes[best].peak_bytes if best in probes else None
        return MaxBatch(chip.name, chip.version, prec, training, best, limit, reason, cap, limit_max, peak,
                        list(probes.values()))

    p1 = probe(1)
    if not p1.ok:
        return result(0, p1)
    lo, hi = 1, None          # largest batch known to fit, smallest known not to
    if limit_max == 1:
        return result(1, None)
    p2 = probe(2)
    if not p2.ok:
        return result(1, p2)
    lo = 2
    if cap is None:
        guess = limit_max
    else:
        slope = (p2.peak_bytes or 0) - (p1.peak_bytes or 0)
        guess = limit_max if slope <= 0 else 1 + (cap - p1.peak_bytes) // slope
    guess = max(lo + 1, min(limit_max, int(guess)))
    if guess > lo:
        if probe(guess).ok:
            lo = guess
        else:
            hi = guess
    step = max(1, lo // 8)
    while hi is None and lo < limit_max:       # up: a batch above the last that fits
        b = min(limit_max, lo + 1 if lo + 1 not in probes else lo + step)
        if probe(b).ok:
            lo, step = b, step * 2
        else:
            hi = b
    while hi is not None and hi - lo > 1:      # bisect between a fit and a refusal
        mid = (lo + hi) // 2
        if probe(mid).ok:
            lo = mid
        else:
            hi = mid
    return result(lo, probes[hi] if hi is not None else None)
