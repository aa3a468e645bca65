"""A decoder LM over N identical chips: the (tensor, pipeline) splits, each priced, one chosen.

Per split (tp x pp = N chips, all in one fabric domain of the chip's HCD ``interconnect``):

* one pipeline stage's tensor-parallel shard (``shard.shard_lm``: L / pp decoder layers, sizes
  divided by tp) is planned on ONE chip by the single-chip planner (its per-call time, its peak
  memory with its KV cache slice: the memory per chip);
* per token, every stage's shard runs in turn (decode with one micro-batch: pipeline stages wait
  on each other, so the latency is the sum of the stages; no micro-batching, no bubble filling):
  ``pp x stage time``. Each stage's plan holds the embedding and the LM head: counted once per
  stage, an overestimate of (pp - 1) x (embedding + head) on a pipeline;
* collectives (``collectives.py``): two all-reduces per layer of batch x tokens x hidden
  activations (after the row-parallel o_proj and down_proj), one after the vocabulary-parallel
  embedding, an all-gather of the last token's logits; (pp - 1) point-to-point hand-offs of the
  activations between stages. Collectives are not overlapped with compute (decode has nothing to
  overlap them with: each needs the previous kernel's output).

The split chosen is the one with the smallest per-token decode latency whose plan fits every
chip's memory, or the one the user fixes (``--tp``, ``--pp``). To choose, each candidate is first
*estimated* from the plans of its shard with one and with two decoder layers: the layers are
identical, so a stage's time and peak memory are affine in its layer count (exact for the time:
tests/parallel/test_split.py), and a 70B shard of 80 layers is priced from two small plans. The
chosen split (and the next, if its full plan does not fit) is then planned in full: the figures
shown for it are the full plan's; the other rows are marked estimated.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass

from torchfl.planner.errors import PlanError


class ParallelError(PlanError, ValueError):
    """A multi-chip request that cannot be planned (one line: what, where, how to fix)."""


_CHIPS = re.compile(r"^\s*(\d+)\s*[xX]\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*$")


@dataclass(frozen=True)
class Chips:
    """``--chips 8xH100-SXM5-80GB``: ``count`` identical chips named ``chip``."""

    count: int
    chip: str


def parse_chips(text: str) -> Chips:
    m = _CHIPS.match(text or "")
    if not m or int(m.group(1)) < 1:
        raise ParallelError(f"--chips {text!r}: write COUNTxCHIP, e.g. 8xH100-SXM5-80GB")
    return Chips(int(m.group(1)), m.group(2))


@dataclass(frozen=True)
class Split:
    """tp x pp x ep chips: ``ep`` > 1 only for a mixture-of-experts model (module docstring)."""

    tp: int
    pp: int
    ep: int = 1


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _wanted(chips: int, moe: bool, tp, pp, ep) -> list[Split]:
    """Every tp x pp x ep = ``chips`` that agrees with the fixed ``tp``/``pp``/``ep`` (ep 1 for a dense
    model), the most tensor-parallel first; refused if a fixed one does not use ``chips``."""
    if ep is not None and ep > 1 and not moe:
        raise ParallelError(f"--ep {ep}: expert parallel splits a mixture-of-experts model's experts; this model "
                            "has none (config.num_local_experts); drop --ep")
    eps = [ep] if ep is not None else (_divisors(chips) if moe and tp is None and pp is None else [1])
    out = []
    for e in eps:
        rest, t, p = chips // e, tp, pp
        if (tp or pp) and chips % e == 0:
            t = tp or max(1, rest // (pp or 1))
            p = pp or max(1, rest // t)
            if t * p * e == chips:
                out.append(Split(t, p, e))
        elif chips % e == 0:
            out += [Split(d, rest // d, e) for d in reversed(_divisors(rest))]
    if not out:
        t = tp or max(1, chips // ((pp or 1) * (ep or 1)))
        p = pp or max(1, chips // (t * (ep or 1)))
        e, what = ep or 1, f"--tp {t} x --pp {p}" + (f" x --ep {ep}" if ep else "")
        raise ParallelError(f"{what} = {t * p * e} chips, but --chips gives {chips}; choose tp x pp"
                            f"{' x ep' if ep else ''} = {chips}")
    return out


def candidates(chips: int, config, tp: int | None = None, pp: int | None = None, ep: int | None = None,
               batch: int = 1) -> list[Split]:
    """The (tp, pp, ep) splits of ``chips`` the model admits (tp divides the heads, MLP width and
    vocabulary; pp divides the layers; ep, mixture-of-experts only, divides the experts and the
    ``batch``), or the one fixed by ``tp``/``pp``/``ep`` (refused if it does not use ``chips`` or the
    model does not admit it). The one place the candidates are decided."""
    from torchfl.planner.parallel.experts import check_batch
    from torchfl.planner.parallel.shard import shard_config

    layers = config.num_hidden_layers
    moe = isinstance(getattr(config, "num_local_experts", None), int)
    out, why = [], []
    for s in _wanted(chips, moe, tp, pp, ep):
        if layers % s.pp:
            why.append(f"pp {s.pp} does not divide the {layers} layers")
            continue
        try:
            shard_config(config, s.tp, s.ep)
            check_batch(s.ep, batch)
        except PlanError as exc:
            why.append(str(exc))
            continue
        out.append(s)
    if not out:
        raise ParallelError(f"no split of {chips} chips fits the model: {'; '.join(dict.fromkeys(why))}")
    return out


def _itemsize(lm, precision) -> int:
    import torch

    if precision in ("float16", "bfloat16"):
        return 2
    if precision == "float32":
        return 4
    return torch.empty((), dtype=next(iter(lm.parameters())).dtype).element_size()


def collective_bytes(cfg, split: Split, batch: int, tokens: int, item: int) -> dict:
    """The collectives of one forward over the whole pipeline (module docstring) of a model with
    config ``cfg`` and what they move: ``batch`` x ``tokens`` activations of ``item`` bytes an
    element. ``link_bytes``: bytes sent over all links together, per kind (ring traffic: every
    chip of a tp group sends ``all_reduce_sent`` / ``all_gather_sent``; each of the tp ranks of a
    stage hands its activations to its peer in the next). With ``split.ep`` > 1 each of the ep
    groups runs batch / ep sequences (the tp all-reduces and hand-offs are of those), plus the
    two all-to-alls per MoE layer of ``experts.expert_bytes``, run by each of the tp ranks (``a2a``
    keys; ``link_bytes["all_to_all"]``). The one schedule both the pricing
    (:func:`collective_seconds`) and the emulated execution's byte check read."""
    from torchfl.planner.parallel.collectives import all_gather_sent, all_reduce_sent

    local = batch // split.ep
    act = local * tokens * cfg.hidden_size * item
    logits = local * cfg.vocab_size * item             # the last token's logits, gathered
    reduces = 2 * cfg.num_hidden_layers + 1 if split.tp > 1 else 0
    hand_offs = split.pp - 1
    groups = split.ep
    links = {"all_reduce": groups * reduces * split.tp * all_reduce_sent(act, split.tp),
             "all_gather": groups * split.tp * all_gather_sent(logits, split.tp),
             "p2p": groups * hand_offs * split.tp * act}
    out = {"all_reduces": reduces, "all_reduce_bytes": act, "all_gather_bytes": logits, "hand_offs": hand_offs,
           "p2p_bytes": act, "link_bytes": links}
    if split.ep > 1:
        from torchfl.planner.parallel.experts import expert_bytes

        a2a = expert_bytes(cfg, split.ep, batch, tokens, item)
        links["all_to_all"] = split.tp * a2a["link_bytes"]["all_to_all"]
        out.update(all_to_alls=a2a["all_to_alls"], all_to_all_block_bytes=a2a["block_bytes"])
    return out


def collective_seconds(cfg, split: Split, batch: int, tokens: int, item: int, ic) -> dict:
    """Seconds of one forward's collectives over the whole pipeline (module docstring) of a model
    with config ``cfg`` (:func:`collective_bytes`: what moves), and per kind (``collectives``) the
    calls, the bytes sent over all links per token of the forward and the seconds. The ep groups
    and the tp ranks' all-to-alls run at once (each chip's own links: one call's time)."""
    from torchfl.planner.parallel.collectives import all_gather_s, all_reduce_s, all_to_all_s, p2p_s

    b = collective_bytes(cfg, split, batch, tokens, item)
    act, reduces = b["all_reduce_bytes"], b["all_reduces"]
    ar = reduces * all_reduce_s(act, split.tp, ic)
    ag = all_gather_s(b["all_gather_bytes"], split.tp, ic)
    hand = b["hand_offs"] * p2p_s(b["p2p_bytes"], ic)
    a2a = b.get("all_to_alls", 0) * all_to_all_s(b.get("all_to_all_block_bytes", 0), split.ep, ic)
    per_token = max(1, batch * tokens)
    calls = {"all_reduce": reduces if split.tp > 1 else 0, "all_gather": 1 if split.tp > 1 else 0,
             "p2p": b["hand_offs"], "all_to_all": b.get("all_to_alls", 0)}
    secs = {"all_reduce": ar, "all_gather": ag, "p2p": hand, "all_to_all": a2a}
    kinds = {k: {"calls": calls[k], "bytes_per_token": b["link_bytes"].get(k, 0.0) / per_token, "seconds": secs[k]}
             for k in calls if calls[k]}
    return {"all_reduces": reduces, "all_reduce_bytes": act, "all_reduce_s": ar, "all_gather_s": ag,
            "p2p_s": hand, "all_to_all_s": a2a, "collective_s": ar + ag + hand + a2a, "collectives": kinds}


def _stage(lm, target, split: Split, layers: int, batch: int, context: int, precision, engine, direct=False):
    """(Decoder, Planned, stage seconds) of one stage's shard with ``layers`` layers. ``direct``:
    captured at this (batch, context) only (one torch.export; the Decoder's symbolic capture, which
    serves later probes at other contexts, costs about twice as much: an estimate needs none)."""
    from torchfl.planner.parallel.shard import shard_lm
    from torchfl.planner.whatif.context import Decoder, plan_decode
    from torchfl.planner.whatif.serving import paged_saving

    dec = Decoder(shard_lm(lm, split.tp, layers, split.ep))
    batch //= split.ep
    if direct:
        from torchfl.planner.capture import capture_module
        from torchfl.planner.lm import decode_inputs, rename_cache_inputs
        from torchfl.planner.whatif.planning import plan_on

        module, inputs = decode_inputs(dec.lm, batch, context, dec.spec)
        captured = rename_cache_inputs(capture_module(module, inputs), dec.spec.layers)
        step = plan_on(target, captured, dec.step_inputs(batch, context), precision)
    else:
        step = plan_decode(target, dec, batch, context, precision)
    if not step.ok:
        return dec, step, None
    stage = step.plan.summary.per_call_time_s
    if engine.cache == "paged":
        stage -= paged_saving(step.plan, target.model)
    return dec, step, stage


def _failed(row: dict, step, t0: float) -> dict:
    row.update(ok=False, error_kind=step.error.kind, error=str(step.error).splitlines()[0],
               planning_s=round(time.perf_counter() - t0, 3))
    return row


def _priced(lm, target, row: dict, split: Split, batch: int, stage: float, bound: str, share: float,
            precision, t0: float) -> dict:
    comm = collective_seconds(lm.config, split, batch, 1, _itemsize(lm, precision), target.hcd.interconnect)
    compute = split.pp * stage
    total = compute + comm["collective_s"]
    bound_s = share * compute
    if comm["collective_s"] > bound_s:
        bound, bound_s = "link", comm["collective_s"]
    row.update(ok=True, stage_s=stage, compute_s=compute, **comm, decode_s=total,
               tokens_per_s=batch / total if total > 0 else float("inf"),
               collective_share=comm["collective_s"] / total if total else 0.0,
               bound=bound, bound_share=round(bound_s / total, 3) if total else 0.0,
               precision=precision, planning_s=round(time.perf_counter() - t0, 3))
    return row


def _decode_split(lm, target, split: Split, batch: int, context: int, precision, engine) -> dict:
    """One split priced from the full plan of its stage's shard, captured as the estimates are
    (``direct``): the same graph, so an estimate and its full plan agree (a MoE shard's symbolic
    capture adds steps the direct one folds: 4% apart, tests/parallel/test_expert_split.py), and
    one torch.export instead of the symbolic capture's two."""
    from torchfl.planner.whatif.compare import bound_resource

    t0 = time.perf_counter()
    layers = lm.config.num_hidden_layers // split.pp
    row = {"tp": split.tp, "pp": split.pp, "ep": split.ep, "layers_per_stage": layers, "estimated": False}
    dec, step, stage = _stage(lm, target, split, layers, batch, context, precision, engine, direct=True)
    if stage is None:
        return _failed(row, step, t0)
    bound, share = bound_resource(step.plan, target.model)
    row.update(peak_bytes=step.peak_bytes, kv_cache_bytes=dec.cache_bytes(batch // split.ep, context),
               fallbacks=step.plan.summary.fallbacks)
    _priced(lm, target, row, split, batch, stage, bound, share, step.precision, t0)
    row["_dec"] = dec
    return row


def _estimate_split(lm, target, split: Split, batch: int, context: int, precision, engine) -> dict:
    """One split estimated from its stage shard's plans at one and two layers (module docstring):
    time and peak memory affine in the layer count."""
    from torchfl.planner.whatif.compare import bound_resource

    t0 = time.perf_counter()
    layers = lm.config.num_hidden_layers // split.pp
    row = {"tp": split.tp, "pp": split.pp, "ep": split.ep, "layers_per_stage": layers, "estimated": True}
    d1, p1, s1 = _stage(lm, target, split, 1, batch, context, precision, engine, direct=True)
    if s1 is None:
        return _failed(row, p1, t0)
    d2, p2, s2 = _stage(lm, target, split, 2, batch, context, precision, engine, direct=True)
    if s2 is None:
        return _failed(row, p2, t0)
    k = layers - 1
    peak = p1.peak_bytes + k * (p2.peak_bytes - p1.peak_bytes)
    bound, share = bound_resource(p2.plan, target.model)
    row.update(peak_bytes=peak, kv_cache_bytes=d1.cache_bytes(batch // split.ep, context) * layers,
               fallbacks=p2.plan.summary.fallbacks)
    cap = target.model.memory_bytes
    if cap is not None and peak > cap:
        row.update(ok=False, error_kind="MemoryError", planning_s=round(time.perf_counter() - t0, 3),
                   error=f"one stage's shard needs about {peak / (1 << 30):.2f} GiB per chip (estimated from its "
                         f"1- and 2-layer plans), more than the chip's {cap / (1 << 30):.2f} GiB")
        return row
    return _priced(lm, target, row, split, batch, s1 + k * (s2 - s1), bound, share, p2.precision, t0)


def _prefill(lm, target, row: dict, batch: int, prompt: int, precision) -> None:
    """The chosen split's prefill of ``prompt`` tokens (time to first token), into ``row``."""
    from torchfl.planner.whatif.planning import plan_on
    from torchfl.planner.whatif.serving import prefill_capture

    dec = row["_dec"]
    split = Split(row["tp"], row["pp"], row["ep"])
    captured, inputs = prefill_capture(dec, batch // split.ep, prompt)
    p = plan_on(target, captured, inputs, precision)
    if not p.ok:
        row.update(prefill_error=str(p.error).splitlines()[0])
        return
    comm = collective_seconds(lm.config, split, batch, prompt, _itemsize(lm, p.precision), target.hcd.interconnect)
    row.update(prefill_s=split.pp * p.plan.summary.per_call_time_s + comm["collective_s"],
               prefill_collective_s=comm["collective_s"], prefill_fallbacks=p.plan.summary.fallbacks)


def plan_parallel(lm, target, chips: int, batch: int = 1, context: int = 1024, prompt: int | None = None,
                  precision="auto", engine=None, tp: int | None = None, pp: int | None = None,
                  ep: int | None = None) -> dict:
    """A causal LM's decode step over ``chips`` copies of ``target`` (a Target whose HCD states an
    ``interconnect``): every admitted split priced (:func:`candidates`), the chosen one first
    (``rows[0]``; ``split``), with ``prompt``: its prefill too. Plain data for ``--json``."""
    from torchfl.planner.whatif.serving import Engine

    t0 = time.perf_counter()
    ic = target.hcd.interconnect
    if ic is None:
        raise ParallelError(f"{target.name} {target.version} states no interconnect: its HCD has no "
                            "`interconnect:` section (links, bandwidth, fabric); add one to plan it on several chips")
    if chips > ic.domain_chips:
        raise ParallelError(f"{chips} chips exceed {target.name}'s fabric domain of {ic.domain_chips} "
                            f"(HCD field interconnect.domain_chips); use at most {ic.domain_chips}")
    engine = engine or Engine()
    target = engine.on(target)
    splits = candidates(chips, lm.config, tp, pp, ep, batch)
    if len(splits) == 1:
        rows = [_decode_split(lm, target, splits[0], batch, context, precision, engine)]
    else:
        rows = [_estimate_split(lm, target, s, batch, context, precision, engine) for s in splits]
    chosen = None
    for est in sorted((r for r in rows if r["ok"]), key=lambda r: (r["decode_s"], -r["tp"], r["ep"])):
        full = est if not est["estimated"] else _decode_split(lm, target, Split(est["tp"], est["pp"], est["ep"]), batch,
                                                              context, precision, engine)
        rows[rows.index(est)] = full
        if full["ok"]:
            chosen = full
            break
    if chosen is not None and prompt:
        _prefill(lm, target, chosen, batch, prompt, precision)
    for r in rows:
        r.pop("_dec", None)
    ordered = ([chosen] if chosen else []) + [r for r in rows if r is not chosen]
    return {"chip": target.name, "version": target.version, "chips": chips, "fabric": ic.fabric,
            "bus_gb_per_s": ic.bus_bytes_per_s / 1e9, "batch": batch, "context": context, "prompt": prompt,
            "chosen_by": "user" if len(splits) == 1 and (tp or pp or ep) else "cost", "ok": chosen is not None,
            "split": None if chosen is None else {"tp": chosen["tp"], "pp": chosen["pp"], "ep": chosen["ep"]},
            "rows": ordered, "capacity_bytes": target.model.memory_bytes, "engine": engine.to_dict(),
            "assumes": engine.describe(target) + "; " + ASSUMES + (EP_ASSUMES if any(s.ep > 1 for s in splits) else ""),
            "planning_s": round(time.perf_counter() - t0, 3)}


ASSUMES = ("tensor parallel: 2 ring all-reduces per layer, not overlapped; pipeline: stages in turn, "
           "one micro-batch")
EP_ASSUMES = ("; expert parallel: 2 all-to-alls per MoE layer, not overlapped, attention data parallel over "
              "the ep groups")


def to_dict(split: Split) -> dict:
    return asdict(split)
