"""A causal LM's serving speed, predicted: the prefill of a prompt and one decode step per chip
(time to first token, tokens/s, the decode step's peak memory), ranked."""

from __future__ import annotations

import time

from torchfl.planner.whatif.compare import bound_resource
from torchfl.planner.whatif.context import Decoder, plan_decode
from torchfl.planner.whatif.planning import auto_precision, plan_on


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
