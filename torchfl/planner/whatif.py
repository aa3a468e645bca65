"""What-if planning: questions answered by planning, before a chip is in hand.

* :func:`max_batch`: the largest batch whose plan fits the chip (memory, ``max_batch_size``,
  sequence length), found by planning at a few batches, never by running;
* :func:`compare`: one model planned on several chips, side by side;
* :func:`impact`: one model set planned on two versions of a chip, what changed.

Every function captures a model once per shape and plans the capture on each chip (a
capture costs seconds, a plan well under one). Results are plain data with ``to_dict()``
for ``--json``; the CLI (``torchfl plan memory|max-batch|compare|impact``) only formats them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from torchfl.planner.errors import PlanError

if TYPE_CHECKING:
    from torchfl.planner.target import Target

__all__ = ["chip_of", "auto_precision", "example_error", "plan_on", "Planned", "plan_everywhere",
           "max_batch", "MaxBatch", "Probe", "compare", "impact", "Impact", "batched", "bound_resource",
           "training_peak"]

LIMIT_FIELDS = {
    "memory.off_chip_memory.size_gb": "memory",
    "constraints.max_batch_size": "max_batch_size",
    "constraints.max_sequence_length": "sequence length",
    "compute_units.attention.max_sequence_length": "sequence length",
}


# ---------------------------------------------------------------- chips

def chip_of(chip, registry=None, version: str | None = None):
    """The :class:`~torchfl.planner.target.Target` of ``chip`` (a name, an HCD or a Target):
    resolved as the planner does, or ``version`` of that name from the registry."""
    from torchfl.planner.target import Target, open_registry, resolve_target

    if version is None:
        return resolve_target(chip, registry)
    reg = open_registry(registry)
    latest = resolve_target(chip, reg)
    return Target.of(reg.chip(chip, version), latest.packs)


def auto_precision(hcd, requested: str | None) -> str | None:
    """``"auto"``: none on a chip with a float32 unit, else float16, else bfloat16 (the
    first the chip stores); anything else is passed through."""
    if requested != "auto":
        return requested
    if hcd.unit_for("float32") is not None:
        return None
    for p in ("float16", "bfloat16"):
        if p in hcd.stored_dtypes and hcd.unit_for(p) is not None:
            return p
    return None


# ---------------------------------------------------------------- planning one capture on one chip

@dataclass
class Planned:
    """One model on one chip: the plan (and for training, the backward's), or the error."""

    chip: str
    version: str
    precision: str | None
    plan: object = None
    backward: object = None
    error: PlanError | None = None
    planning_s: float = 0.0
    peak_bytes: int | None = None      # device high-water (training: both graphs, see training_peak)

    @property
    def ok(self) -> bool:
        return self.error is None


def plan_on(chip, captured, inputs, precision=None, backward=None) -> Planned:
    """Plan a capture (and a training capture's backward) on ``chip``; a planning error the
    chip's HCD causes is kept, not raised."""
    from torchfl.planner.api import plan_captured

    prec = auto_precision(chip.hcd, precision)
    out = Planned(chip.name, chip.version, prec)
    t0 = time.perf_counter()
    try:
        out.plan = plan_captured(captured, inputs, chip, precision=prec)
        out.peak_bytes = out.plan.memory.peak_bytes
        if backward is not None:
            out.backward = plan_captured(backward, (), chip, precision=prec)
            out.peak_bytes = training_peak(out.plan, out.backward, chip, captured.extra.get("weights", ()))
            _check_training(out, chip)
    except PlanError as exc:
        out.error = exc
    out.planning_s = time.perf_counter() - t0
    return out


def training_peak(forward, backward, chip, weights=()) -> int:
    """Device high-water of one training step as the runtime runs it: the forward (its
    parameter primals ``weights`` cached on the device, as the runtime does), then the
    backward while those weights stay resident. Saved activations cross between the two
    graphs as the backward's inputs, so its memory plan counts them."""
    from torchfl.planner.memory import plan_memory

    m = chip.model
    fw = plan_memory(forward, m.alignment, m.memory_bytes, weights)
    return max(fw.peak_bytes, fw.resident_bytes + backward.memory.peak_bytes)


def _check_training(out: Planned, chip) -> None:
    from torchfl.kernels.units import fmt_bytes
    from torchfl.planner.memory import MemoryLimitError

    cap = chip.model.memory_bytes
    if cap is not None and out.peak_bytes > cap:
        raise MemoryLimitError(
            f"Training step on {chip.name} needs {fmt_bytes(out.peak_bytes)} ({out.peak_bytes} B) of device memory "
            f"(the forward's cached weights plus the backward's peak), more than the chip's {fmt_bytes(cap)} "
            f"({cap} B, HCD field memory.off_chip_memory.size_gb); use a smaller batch", out.backward.memory,
            field="memory.off_chip_memory.size_gb", limit=cap, value=out.peak_bytes)


def example_error(module, inputs) -> str | None:
    """Why ``module(*inputs)`` fails, or None: the forward run once on fake tensors (shapes
    and dtypes only: no compute, no memory), so that a user's model given inputs of the wrong
    shape is one sentence before any capture (torch.export and Dynamo answered with 168-283
    lines of their own). The error is the user's code's, whatever its type."""
    import logging

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    quiet = logging.getLogger("torch")   # fake-tensor dispatch logs the failure at ERROR first
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.no_grad():
            fake = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs)
            module(*fake)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - user code: anything it raises is the user's to fix
        shapes = ", ".join(f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}" if isinstance(x, torch.Tensor)
                           else type(x).__name__ for x in inputs)
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"the model's forward fails on its example inputs ({shapes}): {type(exc).__name__}: {first}"
    finally:
        quiet.setLevel(level)
    return None


def capture(module, inputs, training=False, packs=()):
    """(forward or inference capture, backward capture or None)."""
    from torchfl.planner.capture import capture_module, capture_training

    if training:
        return capture_training(module, inputs, packs)
    return capture_module(module, inputs), None


def plan_everywhere(module, inputs, chips, precision="auto", training=False) -> list[Planned]:
    """``module(*inputs)`` captured once and planned on each of ``chips``."""
    fw, bw = capture(module, inputs, training, chips[0].packs if chips else ())
    return [plan_on(c, fw, inputs if not training else (), precision, bw) for c in chips]


# ---------------------------------------------------------------- rows for compare / impact

def bound_resource(plan, chip_model) -> tuple[str, float]:
    """("compute" | "memory", share of the predicted time in steps bound by it): a step is
    memory-bound when its off-chip bytes take longer than its operations on the unit."""
    mem = comp = 0.0
    for s in plan.steps:
        if s.static:
            continue            # run once: not what a call is bound by
        t_mem = s.predicted_bytes / chip_model.offchip_bw
        t_comp = s.predicted_flops / chip_model.peak_for(s.dtype) if s.predicted_flops else 0.0
        if t_mem >= t_comp:
            mem += s.predicted_time_s
        else:
            comp += s.predicted_time_s
    total = mem + comp
    if total == 0:
        return "-", 0.0
    return ("memory", mem / total) if mem >= comp else ("compute", comp / total)


def row(p: Planned, chip) -> dict:
    """What compare prints per chip (JSON-able)."""
    out = {"chip": p.chip, "version": p.version, "precision": p.precision, "planning_s": round(p.planning_s, 3)}
    if not p.ok:
        out.update(ok=False, error_kind=p.error.kind, error=str(p.error),
                   field=getattr(p.error, "field", None))
        return out
    plans = [x for x in (p.plan, p.backward) if x is not None]
    bound, share = bound_resource(p.plan, chip.model)
    out.update(
        ok=True,
        per_call_time_s=sum(x.summary.per_call_time_s for x in plans),
        per_call_bytes=sum(int(x.summary.per_call_bytes) for x in plans),
        run_once_time_s=sum(x.summary.run_once_time_s for x in plans),
        run_once_bytes=sum(int(x.summary.run_once_bytes) for x in plans),
        peak_bytes=p.peak_bytes,
        capacity_bytes=chip.model.memory_bytes,
        kernels=sum(x.summary.kernels for x in plans),
        fused_groups=sum(x.summary.fused_groups for x in plans),
        conversions=sum(x.summary.conversions for x in plans),
        fallbacks=sum(x.summary.fallbacks for x in plans),
        bound=bound, bound_share=round(share, 3))
    return out


def compare(module, inputs, chips, precision="auto", training=False) -> dict:
    """Rows per chip, fastest first, chips whose plan failed last (with the error)."""
    t0 = time.perf_counter()
    results = plan_everywhere(module, inputs, chips, precision, training)
    by_name = {c.name: c for c in chips}
    rows = [row(p, by_name[p.chip]) for p in results]
    rank_compare_rows(rows)
    return {"rows": rows, "training": training, "planning_s": round(time.perf_counter() - t0, 3)}


def rank_compare_rows(rows: list) -> list:
    """Sort ``compare``'s rows in place the one way every caller shows them (a sweep on a
    cluster too): plans that fit first, then the fastest per call, then by chip name."""
    rows.sort(key=lambda r: (not r["ok"], r.get("per_call_time_s") or 0.0, r["chip"]))
    return rows


# ---------------------------------------------------------------- max batch

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


def _limit_of(exc) -> str:
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
            peak = p.error.value if _limit_of(p.error) == "memory" else (None if mp is None else mp.peak_bytes)
            pr = Probe(b, False, peak, _limit_of(p.error), str(p.error), time.perf_counter() - t0)
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


# ---------------------------------------------------------------- impact of a new chip version

@dataclass
class ModelImpact:
    model: str
    before: dict
    after: dict
    changed_steps: list
    new_fallbacks: list
    fusions_lost: list
    fusions_gained: list
    broke: bool

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Impact:
    chip: str
    v1: str
    v2: str
    changes: list
    models: list

    @property
    def broken(self) -> list:
        return [m.model for m in self.models if m.broke]

    def to_dict(self) -> dict:
        return {"chip": self.chip, "from": self.v1, "to": self.v2, "changes": self.changes,
                "models": [m.to_dict() for m in self.models], "broken": self.broken}


def _assignments(plan) -> dict:
    """FX node group -> how the plan runs it (kernel, layouts, dtype, tiling)."""
    out = {}
    for s in plan.steps:
        if s.kind in ("cast", "layout") or not s.nodes:
            continue
        tile = s.tile or {}
        tiles = tile.get("tiles") or {}
        tiling = tile.get("strategy", "") + ("(" + ",".join(f"{k}={v}" for k, v in
                                                             (tiles.items() if isinstance(tiles, dict) else tiles))
                                             + ")" if tiles else "")
        out["+".join(s.nodes)] = {"kind": s.kind, "kernel": s.kernel or ("cpu" if s.kind == "fallback" else "host"),
                                 "layout": s.layout_out, "layouts_in": ",".join(dict.fromkeys(s.layouts_in)),
                                 "dtype": s.dtype, "tiling": tiling}
    return out


def _summary(p: Planned, chip) -> dict:
    r = row(p, chip)
    r.pop("planning_s", None)
    return r


def diff_plans(before: Planned, after: Planned, model: str, chip1: Target, chip2: Target) -> ModelImpact:
    """What changed for one model between two chips' plans."""
    b, a = _summary(before, chip1), _summary(after, chip2)
    if not (before.ok and after.ok):
        return ModelImpact(model, b, a, [], [], [], [], broke=before.ok and not after.ok)
    x, y = _assignments(before.plan), _assignments(after.plan)
    node_of = {}
    for groups in (x, y):
        for g in groups:
            for n in g.split("+"):
                node_of.setdefault(n, set()).add(g)
    changed = []
    for g in sorted(set(x) | set(y)):
        if g in x and g in y:
            diff = {k: [x[g][k], y[g][k]] for k in x[g] if x[g][k] != y[g][k]}
            if diff:
                changed.append({"nodes": g, "changed": diff, "before": x[g], "after": y[g]})
        elif g in y:
            changed.append({"nodes": g, "changed": {"grouping": ["-", "new group"]}, "before": None, "after": y[g]})
        else:
            changed.append({"nodes": g, "changed": {"grouping": ["group", "split or merged"]}, "before": x[g],
                            "after": None})
    fb1 = {f.node for f in before.plan.fallbacks}
    new_fb = [{"node": f.node, "op": f.op, "reason": f.reason} for f in after.plan.fallbacks if f.node not in fb1]
    fused = lambda groups: {g for g, v in groups.items() if v["kind"] == "fused"}  # noqa: E731
    return ModelImpact(model, b, a, changed, new_fb, sorted(fused(x) - fused(y)), sorted(fused(y) - fused(x)),
                       broke=False)


def impact(chip_name: str, v1: str, v2: str, models, registry=None, precision="auto", training=False,
           progress=None) -> Impact:
    """``models``: (label, module, inputs). Each is captured once and planned on both versions."""
    from torchfl.planner.target import open_registry

    reg = open_registry(registry)
    changes = [c.as_dict() for c in reg.diff(chip_name, v1, v2)]
    c1, c2 = chip_of(chip_name, reg, v1), chip_of(chip_name, reg, v2)
    out = []
    for label, module, inputs in models:
        before, after = plan_everywhere(module, inputs, [c1, c2], precision, training)
        out.append(diff_plans(before, after, label, c1, c2))
        if progress is not None:
            progress(out[-1])
    return Impact(chip_name, v1, v2, changes, out)


# ---------------------------------------------------------------- decoders: the KV cache and the context

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
    peak = p.error.value if _limit_of(p.error) == "memory" else (None if mp is None else mp.peak_bytes)
    return Probe(at, False, peak, _limit_of(p.error), str(p.error), seconds)


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


# ---------------------------------------------------------------- decode speed, predicted

def prefill_capture(dec: Decoder, batch: int, prompt: int):
    """(Captured prefill of a ``prompt``-token prompt, its inputs): captured once, planned on
    every chip."""
    import torch

    from torchfl.planner.capture import capture_module
    from torchfl.planner.lm import prefill_inputs

    module, inputs = prefill_inputs(dec.lm, batch, prompt, dec.spec)
    captured = capture_module(module, inputs)
    return captured, tuple(torch.empty(x.shape, dtype=x.dtype, device="meta") for x in inputs)


def decode_row(chip, dec: Decoder, batch: int, prompt: int, context: int, precision="auto",
               prefill=None, keep: dict | None = None) -> dict:
    """Predicted serving speed of ``dec`` on ``chip``: the prefill of a ``prompt``-token prompt,
    one decode step at ``context`` (per-token latency; tokens/s = batch / latency) and the
    decode step's peak memory (KV cache included). ``prefill``: a :func:`prefill_capture` to
    reuse; ``keep``: receives the two plans (``decode``, ``prefill``). A chip that cannot plan
    either keeps its error."""
    prefill = prefill or prefill_capture(dec, batch, prompt)
    t0 = time.perf_counter()
    step = plan_decode(chip, dec, batch, context, precision)
    pre = plan_on(chip, prefill[0], prefill[1], precision)
    if keep is not None:
        keep.update(decode=step.plan, prefill=pre.plan)
    out = {"chip": chip.name, "version": chip.version, "precision": auto_precision(chip.hcd, precision),
           "batch": batch, "prompt": prompt, "context": context}
    bad = next((p for p in (step, pre) if not p.ok), None)
    if bad is not None:
        out.update(ok=False, error_kind=bad.error.kind, error=str(bad.error), field=getattr(bad.error, "field", None),
                   planning_s=round(time.perf_counter() - t0, 3))
        return out
    decode_s = step.plan.summary.predicted_time_s
    bound, share = bound_resource(step.plan, chip.model)
    out.update(ok=True, prefill_s=pre.plan.summary.predicted_time_s, decode_s=decode_s,
               tokens_per_s=batch / decode_s if decode_s > 0 else float("inf"),
               time_to_first_token_s=pre.plan.summary.predicted_time_s,
               peak_bytes=step.peak_bytes, capacity_bytes=chip.model.memory_bytes,
               kv_cache_bytes=dec.cache_bytes(batch, context),
               fallbacks=step.plan.summary.fallbacks + pre.plan.summary.fallbacks,
               fused_groups=step.plan.summary.fused_groups, bound=bound, bound_share=round(share, 3),
               planning_s=round(time.perf_counter() - t0, 3))
    return out


def compare_decode(lm, chips, batch: int = 1, prompt: int = 128, context: int = 1024, precision="auto") -> dict:
    """A causal LM's serving speed on each chip (:func:`decode_row`), most tokens/s first,
    chips that cannot plan it last. The prefill and the decode step are captured once."""
    t0 = time.perf_counter()
    dec = Decoder(lm)
    prefill = prefill_capture(dec, batch, prompt)
    rows = [decode_row(c, dec, batch, prompt, context, precision, prefill) for c in chips]
    rows.sort(key=lambda r: (not r["ok"], -(r.get("tokens_per_s") or 0.0), r["chip"]))
    return {"rows": rows, "batch": batch, "prompt": prompt, "context": context,
            "planning_s": round(time.perf_counter() - t0, 3)}
