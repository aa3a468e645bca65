"""Language-model rows of a fidelity table: the planner's serving prediction (prefill, one decode
step, a whole request) of a causal LM on a chip, scored against published measurements.

Row kinds (``op``; docs in :mod:`torchfl.fidelity.tables`), ``shapes`` one ``BxT`` shape:

- ``prefill``: the prompt's forward pass, ``B`` prompts of ``T`` tokens (time to first token);
- ``decode``: one decode step of ``B`` sequences bringing the KV cache to ``T`` positions
  (the per-token latency at context ``T``);
- ``generate``: a request of ``B`` prompts of ``T`` tokens and ``new_tokens`` generated tokens:
  the prefill (which yields the first token) and ``new_tokens - 1`` decode steps, priced at
  their mean context ``T + new_tokens // 2`` (a decode step's time is close to linear in the
  context, so the mean context gives the sum).

``args`` names the model (``{"model": "llama-2-7b"}``; :data:`MODELS`) and may say how the measured
engine submits its kernels, ``"submission"``: ``"eager"`` (the default: one host call, and the
host's synchronisation, per kernel: the HCD's ``launch_overhead_us`` / ``matrix_launch_overhead_us``)
or ``"graph"`` (the whole step enqueued at once, CUDA Graphs or a fused C++ engine loop: each kernel
costs the HCD's ``execution.graph_launch_overhead_us``, where the chip states one; else the eager
costs stay and the notes say so), and how its KV cache grows, ``"kv_cache"``: ``"copied"`` (the
default: each step copies the whole cache, ``torch.cat`` as HF's DynamicCache, the plan as
captured) or ``"paged"`` (written in place, only the new token's keys and values: vLLM's paged
cache, TensorRT-LLM's and LMDeploy's block caches, gpt-fast's static cache). These are the
engine behaviours ``plan decode`` takes as ``--engine`` / ``--kv-cache``, priced by the same
:class:`~torchfl.planner.whatif.serving.Engine`. A table states in its header comments where it
read them. ``"tp"`` (an integer, default 1) is the measurement's tensor-parallel degree: the row
is priced on ``tp`` chips of the row's kind (``torchfl.planner.parallel``: one shard of the model
planned on one chip, plus its ring all-reduces priced from the HCD's ``interconnect``). The model is built on
the meta device in the row's dtype with its default config (no weights: a 70B model plans here),
captured once per shape (``planner.whatif.Decoder``: the decode step symbolic in the context)
and planned on each chip; the prediction is the plan's per-call time (``Prediction``'s rule,
run-once steps left out) plus the table's harness overhead.
"""
from __future__ import annotations

import re

from torchfl.fidelity.oneop import Prediction, RowError
from torchfl.fidelity.tables import Row

__all__ = ["MODELS", "KINDS", "predict_lm", "check_lm_row"]

#: model name in a table -> planner.lm.llama size
MODELS = {"llama-2-7b": "7b", "llama-2-70b": "70b", "tiny-llama": "tiny"}
KINDS = ("prefill", "decode", "generate")
#: the engine behaviours a row may state (``args``; values: ``kernels.chip.SUBMISSIONS`` and
#: ``planner.whatif.serving.CACHES``)
ENGINE_ARGS = ("submission", "kv_cache")

_DECODERS: dict = {}
_PREFILLS: dict = {}


def check_lm_row(row: Row) -> tuple[str, int, int, int]:
    """(model size, batch, tokens, new tokens) of a language-model row, or RowError naming the fix."""
    model = row.args.get("model")
    if model not in MODELS:
        raise RowError(f"{row.where}: args: {row.op} rows name their model, one of {', '.join(MODELS)} "
                       f"(e.g. {{\"model\": \"llama-2-7b\"}}); got {model!r}")
    from torchfl.kernels.chip import SUBMISSIONS
    from torchfl.planner.whatif.serving import CACHES

    unknown = sorted(set(row.args) - {"model", "new_tokens", "tp", *ENGINE_ARGS})
    if unknown or (row.op != "generate" and "new_tokens" in row.args):
        raise RowError(f"{row.where}: args: {row.op} takes model{', new_tokens' if row.op == 'generate' else ''}, "
                       f"submission, kv_cache and tp; remove {', '.join(unknown or ['new_tokens'])}")
    if row.args.get("submission", "eager") not in SUBMISSIONS:
        raise RowError(f"{row.where}: args: submission is how the engine measured submits its kernels, one of "
                       f"{', '.join(SUBMISSIONS)} (\"graph\": the whole step enqueued at once, e.g. CUDA "
                       f"Graphs); got {row.args['submission']!r}")
    if row.args.get("kv_cache", "copied") not in CACHES:
        raise RowError(f"{row.where}: args: kv_cache is how the engine measured grows its KV cache, one of "
                       f"{', '.join(CACHES)} (\"paged\": written in place, only the new token's keys and values); "
                       f"got {row.args['kv_cache']!r}")
    tp = row.args.get("tp", 1)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise RowError(f"{row.where}: args: tp is the measurement's tensor-parallel degree, an integer >= 1; "
                       f"got {tp!r}")
    if len(row.shapes) != 1 or len(row.shapes[0]) != 2 or min(row.shapes[0]) < 1:
        raise RowError(f"{row.where}: shapes: a {row.op} row has one shape BATCHxTOKENS (1x128), got "
                       f"{';'.join('x'.join(map(str, s)) for s in row.shapes)}")
    batch, tokens = row.shapes[0]
    new = row.args.get("new_tokens", 0)
    if row.op == "generate" and not (isinstance(new, int) and new >= 1):
        raise RowError(f"{row.where}: args: a generate row needs new_tokens, the number of generated tokens (>= 1)")
    if row.op == "decode" and tokens < 2:
        raise RowError(f"{row.where}: shapes: a decode step's context counts the cached positions and the new "
                       f"token: at least 2, got {tokens}")
    return MODELS[model], batch, tokens, new


def _decoder(size: str, dtype: str, tp: int = 1):
    """The Decoder of LLaMA-2 ``size`` in ``dtype``, or of one of its ``tp`` tensor-parallel shards."""
    key = (size, dtype, tp)
    if key not in _DECODERS:
        import torch

        from torchfl.planner.lm import llama
        from torchfl.planner.whatif import Decoder

        model, _inputs = llama(size, dtype=getattr(torch, dtype))
        if tp > 1:
            from torchfl.planner.parallel import shard_lm

            model = shard_lm(model, tp)
        _DECODERS[key] = Decoder(model)
    return _DECODERS[key]


def _prefill(size: str, dtype: str, batch: int, prompt: int, tp: int = 1):
    key = (size, dtype, batch, prompt, tp)
    if key not in _PREFILLS:
        from torchfl.planner.whatif import prefill_capture

        _PREFILLS[key] = prefill_capture(_decoder(size, dtype, tp), batch, prompt)
    return _PREFILLS[key]


def _collectives(size: str, tp: int, batch: int, tokens: int, dtype: str, target) -> float:
    """Seconds of one forward's tensor-parallel collectives over ``tp`` chips of ``target``."""
    if tp == 1:
        return 0.0
    from torchfl.hcd.dtypes import ITEMSIZE
    from torchfl.planner.parallel import Split, collective_seconds

    ic = target.hcd.interconnect
    if ic is None:
        raise RowError(f"tp {tp}: {target.name} states no interconnect (HCD section interconnect:); "
                       "add its links to price the collectives")
    cfg = _decoder(size, dtype, 1).lm.config
    return collective_seconds(cfg, Split(tp, 1), batch, tokens, ITEMSIZE.get(dtype, 2), ic)["collective_s"]


_LAUNCH = re.compile(r"\+(\d+(?:\.\d+)?) us launch")


def _per_call(plan) -> tuple[float, int, float]:
    """(per-call seconds, kernels per call, seconds of it launch costs: the "+N us launch" each
    step's note states, HCD 1.1 execution.launch_overhead_us / matrix_launch_overhead_us)."""
    steps = [s for s in plan.steps if not s.static]
    kernels = [s for s in steps if s.kind not in ("fallback", "fold")]
    launch = sum(float(m.group(1)) * 1e-6 for s in kernels for m in [_LAUNCH.search(s.note or "")] if m)
    return float(sum(s.predicted_time_s for s in steps)), len(kernels), launch


def engine_of(row: Row):
    """The serving :class:`~torchfl.planner.whatif.serving.Engine` a row's args state."""
    from torchfl.planner.whatif.serving import Engine

    return Engine(row.args.get("submission", "eager"), row.args.get("kv_cache", "copied"))


def predict_lm(row: Row, target) -> Prediction:
    """Plan a language-model row on ``target``; a refused plan is a Prediction without a time."""
    from torchfl.planner.capture import CaptureError
    from torchfl.planner.whatif import plan_decode, plan_on
    from torchfl.planner.whatif.serving import paged_saving

    try:
        size, batch, tokens, new = check_lm_row(row)
        engine = engine_of(row)
        target = engine.on(target)
        tp = row.args.get("tp", 1)
        dec = _decoder(size, row.dtype, tp)
        parts, comm = [], 0.0
        if row.op in ("prefill", "generate"):
            captured, inputs = _prefill(size, row.dtype, batch, tokens, tp)
            parts.append((1, plan_on(target, captured, inputs, None)))
            comm += _collectives(size, tp, batch, tokens, row.dtype, target)
        if row.op == "decode" or (row.op == "generate" and new > 1):
            context = tokens if row.op == "decode" else tokens + new // 2
            count = 1 if row.op == "decode" else new - 1
            parts.append((count, plan_decode(target, dec, batch, context, None)))
            comm += count * _collectives(size, tp, batch, 1, row.dtype, target)
    except RowError as exc:
        return Prediction(row, target.name, None, str(exc))
    except (CaptureError, ValueError) as exc:
        return Prediction(row, target.name, None, f"{row.where}: {row.label()}: {str(exc).splitlines()[0]}")
    bad = next((p for _n, p in parts if not p.ok), None)
    if bad is not None:
        return Prediction(row, target.name, None, str(bad.error).splitlines()[0])
    total, steps, fallbacks, notes = row.harness_s, 0, 0, []
    for count, p in parts:
        seconds, kernels, launch = _per_call(p.plan)
        what = "prefill" if p is parts[0][1] and row.op != "decode" else "decode step"
        saved = paged_saving(p.plan, target.model) if what == "decode step" and engine.cache == "paged" else 0.0
        seconds -= saved
        total += count * seconds
        steps += len(p.plan.steps)
        fallbacks += p.plan.summary.fallbacks
        notes.append(f"{what}{f' x{count}' if count > 1 else ''}: {seconds * 1e3:.3g} ms, {kernels} kernels, "
                     f"{launch * 1e3:.3g} ms of it launch costs"
                     + (f"; KV cache paged: {saved * 1e3:.3g} ms of cache copies left out" if saved else ""))
    if engine.submission == "graph":
        notes.append(f"graph submission: {target.model.graph_launch_s * 1e6:.3g} us a kernel "
                     "(execution.graph_launch_overhead_us)" if target.model.graph_priced else
                     "graph submission asked, but the HCD states no execution.graph_launch_overhead_us: "
                     "eager launch costs used")
    if comm:
        total += comm
        notes.append(f"tensor parallel {tp}: one shard planned per chip, +{comm * 1e3:.3g} ms of ring all-reduces "
                     "and the logits' all-gather (interconnect)")
    if row.harness_s:
        notes.append(f"+{row.harness_s * 1e6:.3g} us the table's harness")
    return Prediction(row, target.name, total, "", steps, fallbacks, tuple(notes))
