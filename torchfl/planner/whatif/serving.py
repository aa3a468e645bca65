"""A causal LM's serving speed, predicted: the prefill of a prompt and one decode step per chip
(time to first token, tokens/s, the decode step's peak memory), ranked.

A serving engine's behaviour changes the answer as much as the chip's numbers, so it is an input
(:class:`Engine`), stated with every answer:

- ``submission``: ``eager`` (one host call, and the host's synchronisation, per kernel: the HCD's
  ``launch_overhead_us`` / ``matrix_launch_overhead_us``, as eager PyTorch and HF ``generate``) or
  ``graph`` (the step enqueued at once: CUDA Graphs, an engine's fused C++ loop: each kernel costs
  the HCD's ``execution.graph_launch_overhead_us`` where the chip states one; ``ChipModel.submitted``);
- ``cache``: ``copied`` (each step appends the new token's keys and values by copying the whole
  cache, ``torch.cat`` as HF's DynamicCache does: the plan as captured) or ``paged`` (written in
  place, vLLM's paged cache: each cache append is priced as a write of the new token's slice only,
  by the same ``time_terms`` formula);
- host work between steps (sampling, scheduling, detokenising) is not modelled: 0.

A decode step that falls back to the CPU is priced with its transfers but not its host work (the
cost model has no CPU): its per-token time is a lower bound and no tokens/s is given.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: how the KV cache grows per step (:class:`Engine`)
CACHES = ("copied", "paged")


@dataclass(frozen=True)
class Engine:
    """The serving engine a decode prediction assumes (the module's docstring)."""

    submission: str = "eager"
    cache: str = "copied"

    def __post_init__(self):
        from torchfl.kernels.chip import SUBMISSIONS

        if self.submission not in SUBMISSIONS:
            raise ValueError(f"engine submission {self.submission!r}: use one of {', '.join(SUBMISSIONS)}")
        if self.cache not in CACHES:
            raise ValueError(f"engine cache {self.cache!r}: use one of {', '.join(CACHES)}")

    def on(self, chip):
        """``chip`` (a Target) priced for this engine's submission (same HCD, packs and hash)."""
        if self.submission == chip.model.submission:
            return chip
        from torchfl.planner.target import Target

        return Target(chip.hcd, chip.packs, chip.model.submitted(self.submission))

    def describe(self, chip=None) -> str:
        """What the prediction assumes, in one clause."""
        if self.submission == "graph":
            sub = "graph submission (the step enqueued at once"
            if chip is not None and not chip.model.graph_priced:
                sub += "; this chip states no execution.graph_launch_overhead_us: eager launch costs kept"
            sub += ")"
        else:
            sub = "eager launches (one host call and sync per kernel)"
        cache = ("KV cache copied each step (torch.cat)" if self.cache == "copied"
                 else "KV cache paged in place (only the new token's keys and values written)")
        return f"engine: {sub}, {cache}, no host work between steps"

    def to_dict(self) -> dict:
        return {"submission": self.submission, "cache": self.cache, "host_work_between_steps_s": 0.0}


def _cache_appends(plan) -> list:
    """The steps that append to the KV cache: the concat producing each returned cache tensor
    (through the casts or layout copies after it)."""
    out = []
    for name in plan.outputs[1:]:
        index = plan.values[name].producer if name in plan.values else None
        while index is not None:
            st = plan.steps[index]
            if st.kind in ("cast", "layout") and st.inputs:
                index = plan.values[st.inputs[0]].producer
                continue
            if st.kernel == "concat" and not st.static:
                out.append(st)
            break
    return list({s.index: s for s in out}.values())


def paged_saving(plan, chip) -> float:
    """Seconds the paged cache saves on ``plan``'s decode step: each cache append's time minus the
    time of writing only its new slice (read it, write it: ``time_terms`` of that traffic)."""
    from torchfl.hcd.dtypes import ITEMSIZE
    from torchfl.kernels.tiling import Traffic, time_terms

    saved = 0.0
    for st in _cache_appends(plan):
        new = plan.values[st.inputs[-1]]
        n = ITEMSIZE.get(new.dtype, 4)
        for d in new.shape:
            n *= int(d)
        saved += st.predicted_time_s - time_terms(Traffic(n, n, 0), chip, new.dtype).total_s
    return max(0.0, saved)

from torchfl.planner.whatif.compare import bound_resource
from torchfl.planner.whatif.context import Decoder, plan_decode
from torchfl.planner.whatif.planning import auto_precision, plan_on


def experts_read(lm, batch: int) -> dict | None:
    """A mixture-of-experts model's experts in a decode step of ``batch`` tokens: every expert is
    held in memory, at most ``min(E, batch * k)`` of each layer's E are read (``read_bytes``, the
    expert bytes in that proportion: the bound the grouped GEMM's price takes for the worst
    routing); None for a dense model (:func:`torchfl.planner.lm.experts_of`)."""
    from torchfl.planner.lm import experts_of

    ex = experts_of(lm)
    if ex is None:
        return None
    read = min(ex["per_layer"], batch * ex["active_per_token"])
    return dict(ex, read_per_layer=read, read_bytes=ex["expert_bytes"] * read // ex["per_layer"])


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
               prefill=None, keep: dict | None = None, engine: Engine | None = None,
               evidence: dict | None = None) -> dict:
    """Predicted serving speed of ``dec`` on ``chip``: the prefill of a ``prompt``-token prompt,
    one decode step at ``context`` (per-token latency; tokens/s = batch / latency) and the
    decode step's peak memory (KV cache included). ``prefill``: a :func:`prefill_capture` to
    reuse; ``keep``: receives the two plans (``decode``, ``prefill``); ``engine``: what the
    serving engine does (:class:`Engine`, default eager and a copied cache); ``evidence``: chip
    name -> fidelity summary for the confidence. Times are per call (run-once weight casts are
    paid at load, not per token). A chip that cannot plan either keeps its error."""
    from torchfl.planner.confidence import confidence

    engine = engine or Engine()
    chip = engine.on(chip)
    prefill = prefill or prefill_capture(dec, batch, prompt)
    t0 = time.perf_counter()
    step = plan_decode(chip, dec, batch, context, precision)
    pre = plan_on(chip, prefill[0], prefill[1], precision)
    if keep is not None:
        keep.update(decode=step.plan, prefill=pre.plan)
    out = {"chip": chip.name, "version": chip.version, "precision": auto_precision(chip.hcd, precision),
           "batch": batch, "prompt": prompt, "context": context, "engine": engine.to_dict(),
           "assumes": engine.describe(chip), "experts": experts_read(dec.lm, batch)}
    bad = next((p for p in (step, pre) if not p.ok), None)
    if bad is not None:
        out.update(ok=False, error_kind=bad.error.kind, error=str(bad.error), field=getattr(bad.error, "field", None),
                   planning_s=round(time.perf_counter() - t0, 3))
        return out
    decode_s = step.plan.summary.per_call_time_s
    if engine.cache == "paged":
        decode_s -= paged_saving(step.plan, chip.model)
    prefill_s = pre.plan.summary.per_call_time_s
    bound, share = bound_resource(step.plan, chip.model)
    host = step.plan.summary.fallbacks
    out.update(ok=True, prefill_s=prefill_s, decode_s=decode_s,
               tokens_per_s=None if host else (batch / decode_s if decode_s > 0 else float("inf")),
               decode_is_lower_bound=bool(host),
               time_to_first_token_s=prefill_s,
               peak_bytes=step.peak_bytes, capacity_bytes=chip.model.memory_bytes,
               kv_cache_bytes=dec.cache_bytes(batch, context),
               fallbacks=step.plan.summary.fallbacks + pre.plan.summary.fallbacks, decode_fallbacks=host,
               fused_groups=step.plan.summary.fused_groups, bound=bound, bound_share=round(share, 3),
               confidence=confidence(step.plan, chip, (evidence or {}).get(chip.name) if evidence is not None
                                     else None).to_dict(),
               planning_s=round(time.perf_counter() - t0, 3))
    return out


def compare_decode(lm, chips, batch: int = 1, prompt: int = 128, context: int = 1024, precision="auto",
                   engine: Engine | None = None, registry=None) -> dict:
    """A causal LM's serving speed on each chip (:func:`decode_row`), most tokens/s first, chips
    whose step falls back to the CPU (no tokens/s) after them, chips that cannot plan it last.
    The prefill and the decode step are captured once. ``registry``: where the chips' fidelity
    evidence is read (None: the default)."""
    from torchfl.planner.confidence import fidelity_evidence

    t0 = time.perf_counter()
    engine = engine or Engine()
    dec = Decoder(lm)
    prefill = prefill_capture(dec, batch, prompt)
    evidence = fidelity_evidence(registry, [c.name for c in chips])
    rows = [decode_row(c, dec, batch, prompt, context, precision, prefill, engine=engine, evidence=evidence)
            for c in chips]
    rows.sort(key=lambda r: (not r["ok"], r.get("tokens_per_s") is None, -(r.get("tokens_per_s") or 0.0), r["chip"]))
    return {"rows": rows, "batch": batch, "prompt": prompt, "context": context, "engine": engine.to_dict(),
            "assumes": engine.describe(), "planning_s": round(time.perf_counter() - t0, 3)}
