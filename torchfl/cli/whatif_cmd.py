"""``torchfl plan memory|max-batch|compare|impact|report``: what-if planning, a thin face.

The answers come from :mod:`torchfl.planner.whatif` (and :mod:`torchfl.planner.report`);
this module loads the model, formats text or ``--json`` and turns a user's mistake into one
``Kind: message`` line on stderr with exit code 1. torch is imported inside the commands.
"""

from __future__ import annotations

import functools
import json
import sys

import click

from torchfl.cluster.options import cluster_option, require_ray, resume_option

PRECISIONS = ("auto", "float16", "bfloat16", "none")


def _model_options(f):
    """MODEL's size options, as ``plan explain`` has them."""
    for opt in reversed((
        click.option("--batch", type=click.IntRange(min=1), default=None, help="Batch size of the example input."),
        click.option("--seq-len", type=click.IntRange(min=1), default=None, help="Sequence length (BERT, GPT-2)."),
        click.option("--heads", type=click.IntRange(min=1), default=None, help="Attention heads (BERT, GPT-2)."),
        click.option("--layers", type=click.IntRange(min=1), default=None,
                     help="Encoder/decoder layers (BERT, GPT-2)."),
    )):
        f = opt(f)
    return f


def _common(f):
    for opt in reversed((
        click.option("--precision", type=click.Choice(PRECISIONS), default="auto", show_default=True,
                     help="Precision policy; auto: none on chips with an fp32 unit, else float16 (or bfloat16)."),
        click.option("--training", is_flag=True, help="Plan a training step (forward and backward graphs)."),
        click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's)."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text."),
    )):
        f = opt(f)
    return f


def _fail(kind: str, message: str, code: int = 1) -> None:
    """One line on stderr (a multi-line message keeps its first line), then exit ``code``."""
    first = message.strip().splitlines()[0] if message.strip() else kind
    click.echo(f"{kind}: {first}", err=True)
    sys.exit(code)


def _guarded(f):
    """Errors a user can fix -> one line on stderr, exit 1 (never a traceback)."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        import os
        import warnings

        os.environ.setdefault("TORCHDYNAMO_VERBOSE", "0")
        warnings.filterwarnings("ignore")
        from torchfl.planner.capture import CaptureError
        from torchfl.planner.errors import PlanError
        from torchfl.planner.zoo import ModelError
        from torchfl.registry import RegistryError

        try:
            return f(*args, **kwargs)
        except ModelError as exc:
            _fail("Error", str(exc))
        except PlanError as exc:
            _fail(exc.kind, str(exc))
        except RegistryError as exc:
            _fail("Error", str(exc))
        except CaptureError as exc:   # the model does not run on its example inputs (a wrong shape, ...)
            _fail("Error", f"the model could not be captured on its example inputs: {exc}")

    return wrapper


def _precision(value: str):
    return None if value == "none" else value


def _load(model, batch=None, seq_len=None, heads=None, layers=None):
    """(module, example inputs) of a zoo name or a user's ``file.py:factory``; what a user's
    model gets wrong is a ModelError, one line (:mod:`torchfl.cli.usermodel`)."""
    from torchfl.cli.usermodel import load_user_model

    return load_user_model(model, batch=batch, seq_len=seq_len, num_heads=heads, layers=layers)


def _check_batch(batch, targets, seq_len=None) -> None:
    """Refuse ``--batch`` (and ``--seq-len``) above every chip's ``max_batch_size``
    (``max_sequence_length``) before the inputs are built (``--batch 100000000`` tried to
    allocate 409 GB of example inputs before the planner's check); a size some of the chips
    take is left to each chip's plan."""
    for value, field, label, option in ((batch, "max_batch_size", "Batch size", "--batch"),
                                        (seq_len, "max_sequence_length", "Sequence length", "--seq-len")):
        if value is None or not targets:
            continue
        limits = {t.name: int(getattr(t.hcd.constraints, field)) for t in targets}
        if all(value > n for n in limits.values()):
            name, n = max(limits.items(), key=lambda kv: kv[1])
            chips = name if len(limits) == 1 else f"every chip given (the largest: {name}, {n:,})"
            _fail("RuntimeError", f"{label} {value:,} exceeds {field} {n:,} of {chips} (HCD field "
                                  f"constraints.{field}); use {option} {n} or less")


def _writable_output(output: str):
    """The resolved path of ``-o``, after checking it can be written (before any planning)."""
    from torchfl.cli.files import OutputError, writable_output

    try:
        return writable_output(output)
    except OutputError as exc:
        _fail("Error", str(exc))


def _write_atomically(path, text: str) -> None:
    """``text`` to ``path`` by a temporary file and a rename (a full disk keeps the old report)."""
    from torchfl.cli.files import OutputError, write_atomically

    try:
        write_atomically(path, text)
    except OutputError as exc:
        _fail("Error", str(exc))


def _emit(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def _b(n) -> str:
    from torchfl.planner.memory import fmt_bytes

    return "-" if n is None else fmt_bytes(n)


def _t(s) -> str:
    from torchfl.planner.explain import _time

    return "-" if s is None else _time(s)


def _table(rows, header, right=(), optional=(), indent: int = 0) -> list[str]:
    """Rows fitted to the terminal (100 columns in a pipe) after ``indent`` columns, wrapping
    at spaces, never cutting."""
    from torchfl.planner.texttable import table, terminal_width

    return table(header, [tuple(str(c) for c in r) for r in rows], right=right, optional=optional,
                 width=terminal_width() - indent)


def _para(text: str, indent: str = "", subsequent: str | None = None) -> list[str]:
    from torchfl.planner.texttable import paragraph

    return paragraph(text, indent=indent, subsequent=subsequent)


def _echo(text: str, indent: str = "") -> None:
    """One sentence, wrapped at spaces to the terminal (100 columns in a pipe)."""
    click.echo("\n".join(_para(text, indent=indent, subsequent=indent + "  ")))


def impact_status(m) -> str:
    """One model's outcome, in the words the result and the progress lines both use."""
    b, a = m.before["ok"], m.after["ok"]
    if b and a:
        return "plans on both"
    if b:
        return "BROKEN"
    return "newly plannable" if a else "plans on neither"


def _progress(label):
    """A one-line progress note per probe/chip on stderr (planning takes seconds each)."""
    def note(item):
        text = getattr(item, "batch", None)
        if text is not None:
            state = "fits" if item.ok else f"refused ({item.limit})"
            click.echo(f"{label}: batch {item.batch}: {state}, peak {_b(item.peak_bytes)} ({item.seconds:.1f} s)",
                       err=True)
        else:
            click.echo(f"{label}: {item.model}: {impact_status(item)}", err=True)
    return note


# ---------------------------------------------------------------- plan memory

_CONTEXT = click.option("--context", type=click.IntRange(min=2), default=None,
                        help="A causal LM's decode step at this context (cached positions, KV cache included).")


def _decoder(model, module, training):
    """The what-if Decoder of MODEL for --context (a causal LM; inference only)."""
    from torchfl.planner import whatif
    from torchfl.planner.lm import is_causal_lm

    if training:
        _fail("Error", "--context plans a decoder's inference step; leave out --training")
    if not is_causal_lm(module):
        _fail("Error", f"--context needs a causal language model (a Hugging Face *ForCausalLM); {model} is a "
                       f"{type(module).__name__}")
    return whatif.Decoder(module)


@click.command("memory")
@click.argument("model")
@click.option("--chip", required=True, help="Chip name in the registry, e.g. NPU-V3.")
@_model_options
@_CONTEXT
@_common
@_guarded
def memory(model, chip, batch, seq_len, heads, layers, context, precision, training, registry, as_json):
    """Peak device memory of MODEL's plan on --chip, the step where it occurs and what is live
    then (inputs, parameters, weights in the plan's dtype, activations, outputs; with
    --context, a decoder's decode step and its KV cache per layer)."""
    from torchfl.planner import whatif

    target = whatif.chip_of(chip, registry)
    _check_batch(batch, [target], seq_len)
    module, inputs = _load(model, 1 if context else batch, seq_len, heads, layers)
    if context:
        dec = _decoder(model, module, training)
        p = whatif.plan_decode(target, dec, batch or 1, context, _precision(precision))
        model = f"{model} (decode step, batch {batch or 1}, context {context})"
    else:
        (p,) = whatif.plan_everywhere(module, inputs, [target], _precision(precision), training)
    mp = p.plan.memory if p.ok else getattr(p.error, "memory", None)
    if mp is None:
        raise p.error
    plans = [x for x in (p.plan, p.backward) if x is not None]
    if as_json:
        data = {"model": model, "chip": p.chip, "version": p.version, "precision": p.precision,
                "training": training, "fits": p.ok, "error": None if p.ok else str(p.error),
                "peak_bytes": p.peak_bytes if p.ok else mp.peak_bytes, "capacity_bytes": mp.capacity,
                "graphs": [_memory_json(x.memory, x) for x in plans] if p.ok else [_memory_json(mp, None)]}
        _emit(data)
    else:
        click.echo(f"{model} on {p.chip} {p.version} (precision {p.precision or 'as captured'}"
                   f"{', training step' if training else ''})")
        if p.ok:
            for name, x in zip(("forward", "backward") if training else ("inference",), plans):
                click.echo(_memory_text(x.memory, x, name))
            if training:
                click.echo("\n".join(_para(f"Training step high-water: {_b(p.peak_bytes)} (the forward's cached "
                                           "weights stay resident while the backward runs)")))
        else:
            click.echo(_memory_text(mp, None, "plan"))
    if not p.ok:
        _fail(p.error.kind, str(p.error))


def _memory_json(mp, plan) -> dict:
    from torchfl.planner.memory import kv_cache_table

    d = mp.to_dict()
    if plan is not None:
        d["kv_cache"] = kv_cache_table(plan)
    d["breakdown_at_peak"] = mp.breakdown()
    d["largest_at_peak"] = [b.to_dict() for b in mp.live_at_peak()[:10]]
    if plan is not None and mp.peak_step >= 0:
        s = plan.steps[mp.peak_step]
        d["peak_step_detail"] = {"index": s.index, "kind": s.kind, "kernel": s.kernel, "nodes": list(s.nodes)}
    return d


def _memory_text(mp, plan, name) -> str:
    from torchfl.planner.memory import WHY

    where = "during the uploads (before step 0)" if mp.peak_step < 0 else f"at step {mp.peak_step}"
    if plan is not None and mp.peak_step >= 0:
        s = plan.steps[mp.peak_step]
        where += f" ({s.kernel or s.kind}{' ' + s.nodes[-1] if s.nodes else ''})"
    cap = "capacity unbounded (no off_chip_memory.size_gb)" if mp.capacity is None else \
        f"capacity {_b(mp.capacity)}: {100 * mp.peak_bytes / mp.capacity:.1f}% used"
    lines = _para(f"{name}: peak {_b(mp.peak_bytes)} ({mp.peak_bytes:,} B) {where}; {cap}; "
                  f"{_b(mp.resident_bytes)} resident between calls; buffers aligned to {mp.alignment} B")
    rows = [(k, _b(n), f"{n:,}", WHY[k]) for k, n in mp.breakdown().items() if n]
    lines += ["  " + x for x in _table(rows, ("live at peak", "size", "bytes", "what"), right=(1, 2), indent=2)]
    top = mp.live_at_peak()[:8]
    rows = [(b.name, b.kind, _b(b.nbytes), "before step 0" if b.alloc < 0 else f"step {b.alloc}",
             "kept" if b.free is None else ("after return" if plan is not None and b.free >= len(plan.steps)
                                            else f"after step {b.free}")) for b in top]
    lines += ["  " + x for x in _table(rows, ("largest buffers at peak", "kind", "size", "allocated", "freed"),
                                       right=(2,), indent=2)]
    if plan is not None:
        from torchfl.planner.memory import kv_cache_table

        cache = kv_cache_table(plan)
        if cache:
            total = sum(c["bytes"] for c in cache)
            lines += _para(f"KV cache: {_b(total)} in {len({c['layer'] for c in cache})} layers (the grown cache "
                           "the step returns; the past it reads is freed layer by layer)", indent="  ")
            rows = [(c["layer"], c["kind"], "x".join(map(str, c["shape"])), c["dtype"], _b(c["bytes"])) for c in cache]
            lines += ["  " + x for x in _table(rows, ("layer", "cache", "shape [B, heads, positions, dim]", "dtype",
                                                     "size"), right=(0, 4), indent=2)]
    return "\n".join(lines)


# ---------------------------------------------------------------- plan max-batch

@click.command("max-batch")
@click.argument("model")
@click.option("--chip", required=True, help="Chip name in the registry, e.g. EDGE-C2.")
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="Sequence length (BERT, GPT-2).")
@click.option("--heads", type=click.IntRange(min=1), default=None, help="Attention heads (BERT, GPT-2).")
@click.option("--layers", type=click.IntRange(min=1), default=None, help="Encoder/decoder layers (BERT, GPT-2).")
@_CONTEXT
@_common
@_guarded
def max_batch(model, chip, seq_len, heads, layers, context, precision, training, registry, as_json):
    """The largest batch of MODEL whose plan fits --chip (off-chip memory, max_batch_size,
    sequence length), found by planning at a few batches (nothing runs); names the limit.
    With --context, a causal LM's decode step at that context (its KV cache grows with the batch)."""
    from torchfl.planner import whatif

    target = whatif.chip_of(chip, registry)
    _check_batch(None, [target], seq_len)
    module, inputs = _load(model, 1, seq_len, heads, layers)
    progress = None if as_json else _progress("max-batch")
    if context:
        dec = _decoder(model, module, training)
        res = whatif.max_batch_at_context(module, target, context, _precision(precision), progress, dec)
        model = f"{model} (decode step at context {context})"
    else:
        res = whatif.max_batch(module, inputs, target, _precision(precision), training, progress=progress)
    if as_json:
        _emit(dict(res.to_dict(), model=model))
        return
    what = "training step" if training else "inference"
    if res.batch == 0:
        click.echo("\n".join(_para(f"{model} ({what}) does not fit {res.chip} {res.version} even at batch 1: "
                                   f"{res.limit}")))
        click.echo("\n".join(_para(res.reason, indent="  ")))
        sys.exit(1)
    peak = f", peak {_b(res.peak_bytes)}" + (f" of {_b(res.capacity_bytes)}" if res.capacity_bytes else "")
    click.echo("\n".join(_para(f"max batch of {model} ({what}, precision {res.precision or 'as captured'}) on "
                               f"{res.chip} {res.version}: {res.batch}{peak}")))
    click.echo(f"limited by: {res.limit}")
    click.echo("\n".join(_para(res.reason.splitlines()[0], indent="  ")))
    rows = [(p.batch, "fits" if p.ok else f"refused: {p.limit}", _b(p.peak_bytes), f"{p.seconds:.1f} s")
            for p in sorted(res.probes, key=lambda p: p.batch)]
    click.echo("\n".join(_table(rows, ("batch", "plan", "peak", "planning"), right=(0, 2, 3))))


# ---------------------------------------------------------------- plan max-context

@click.command("max-context")
@click.argument("model")
@click.option("--chip", required=True, help="Chip name in the registry, e.g. EDGE-C2.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Sequences decoded at once.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="auto", show_default=True,
              help="Precision policy; auto: none on chips with an fp32 unit, else float16 (or bfloat16).")
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@_guarded
def max_context(model, chip, batch, precision, registry, as_json):
    """The longest context of the causal LM MODEL whose decode step fits --chip at --batch
    (the KV cache grows with every token), found by planning (nothing runs); names the limit:
    the off-chip memory, the chip's sequence limits or the model's positions."""
    from torchfl.planner import whatif

    module, _inputs = _load(model)
    dec = _decoder(model, module, False)
    target = whatif.chip_of(chip, registry)
    res = whatif.max_context(module, target, batch, _precision(precision),
                             None if as_json else _context_progress, dec)
    if as_json:
        _emit(dict(res.to_dict(), model=model))
        return
    if res.context == 0:
        _echo(f"{model} does not fit {res.chip} {res.version} at batch {batch} even with a short context: "
              f"{res.limit}")
        _echo(res.reason.splitlines()[0], indent="  ")
        sys.exit(1)
    peak = f", peak {_b(res.peak_bytes)}" + (f" of {_b(res.capacity_bytes)}" if res.capacity_bytes else "")
    _echo(f"max context of {model} (batch {batch}, precision {res.precision or 'as captured'}) on {res.chip} "
          f"{res.version}: {res.context} tokens{peak}, KV cache {_b(res.kv_cache_bytes)}")
    click.echo(f"limited by: {res.limit}")
    _echo(res.reason.splitlines()[0], indent="  ")
    rows = [(p.batch, "fits" if p.ok else f"refused: {p.limit}", _b(p.peak_bytes), f"{p.seconds:.1f} s")
            for p in sorted(res.probes, key=lambda p: p.batch)]
    click.echo("\n".join(_table(rows, ("context", "plan", "peak", "planning"), right=(0, 2, 3))))


def _context_progress(item):
    state = "fits" if item.ok else f"refused ({item.limit})"
    click.echo(f"max-context: context {item.batch}: {state}, peak {_b(item.peak_bytes)} ({item.seconds:.1f} s)",
               err=True)


# ---------------------------------------------------------------- plan compare

_PROMPT = click.option("--prompt", type=click.IntRange(min=1), default=128, show_default=True,
                       help="With --context: the prompt length whose prefill is timed.")


@click.command("compare")
@click.argument("model")
@click.option("--chips", default=None, help="Comma-separated chip names (default: every chip in the registry).")
@_model_options
@_CONTEXT
@_PROMPT
@_common
@cluster_option
@resume_option
@_guarded
def compare(model, chips, batch, seq_len, heads, layers, context, prompt, precision, training, registry, as_json,
            cluster, resume):
    """MODEL planned on every chip (or --chips): predicted time, off-chip bytes, peak memory,
    kernels, fusions, fallbacks and the bound resource, fastest first; or what stops it.
    With --context, a causal LM's serving speed: prefill of --prompt tokens, per-token decode
    latency and tokens/s at that context, most tokens/s first. With --cluster, each chip is a
    unit on the Ray cluster, recorded in the registry (--resume RUN)."""
    from torchfl.planner import whatif

    require_ray(cluster)
    names = _chip_names(chips, registry)
    targets = [whatif.chip_of(n, registry) for n in names]
    _check_batch(batch, targets, seq_len)
    if (cluster is not None or resume is not None) and context:
        _fail("Error", "--cluster/--resume plan compare without --context (a decode comparison runs here)", code=2)
    if cluster is not None or resume is not None:
        from torchfl.cluster.whatif import check_model, sweep_compare

        check_model(model)
        size = dict(batch=batch, seq_len=seq_len, heads=heads, layers=layers)
        res = _swept(cluster, resume, registry, lambda **kw: sweep_compare(
            model, size, names, precision=_precision(precision), training=training, **kw))
        if as_json:
            _emit(dict(res, model=model))
            return
        click.echo(_compare_text(model, res))
        return
    module, inputs = _load(model, 1 if context else batch, seq_len, heads, layers)
    if context:
        _decoder(model, module, training)
        res = whatif.compare_decode(module, targets, batch or 1, prompt, context, _precision(precision))
        if as_json:
            _emit(dict(res, model=model))
        else:
            click.echo(_decode_text(model, res))
        return
    res = whatif.compare(module, inputs, targets, _precision(precision), training)
    if as_json:
        _emit(dict(res, model=model))
        return
    click.echo(_compare_text(model, res))


def _swept(cluster, resume, registry, call):
    """``call(registry=, runner=, resume=, echo=, state=)`` as a recorded sweep (``--cluster`` or ``--resume``)."""
    from torchfl.cluster.options import reported
    from torchfl.cluster.options import runner as make_runner
    from torchfl.registry import Registry

    reg, state = Registry(registry), {}
    echo = lambda line: click.echo(line, err=True)  # noqa: E731
    runner = make_runner(cluster, 1, echo=echo)
    with reported(lambda: state.get("sweep")):
        try:
            if cluster is not None:
                runner.connect()   # an unreachable cluster is refused before a sweep run is recorded
            return call(registry=reg, runner=runner, resume=resume, echo=echo, state=state)
        finally:
            runner.close()


def _chip_names(chips, registry) -> list[str]:
    from torchfl.planner import whatif

    if chips:
        names = [c.strip() for c in chips.split(",") if c.strip()]
        if not names:
            _fail("Error", "--chips is empty; give comma-separated chip names, e.g. --chips NPU-V2,NPU-V3")
        return names
    return whatif.registry_chips(registry)


def _compare_text(model, res) -> str:
    rows, errors = [], []
    for r in res["rows"]:
        if r["ok"]:
            cap = _b(r["capacity_bytes"]) if r["capacity_bytes"] else "-"
            rows.append((r["chip"], r["version"], r["precision"] or "-", _t(r["per_call_time_s"]),
                         _t(r["run_once_time_s"]), _b(r["per_call_bytes"]), _b(r["peak_bytes"]), cap, r["kernels"],
                         r["fused_groups"], r["conversions"], r["fallbacks"],
                         f"{r['bound']} ({100 * r['bound_share']:.0f}%)"))
        else:
            errors += _para(f"{r['chip']} {r['version']}: {r['error_kind']}: {r['error'].splitlines()[0]}",
                            indent="  ", subsequent="    ")
    what = "training step" if res["training"] else "inference"
    out = [f"{model} ({what}) on {len(res['rows'])} chips, planned in {res['planning_s']:.1f} s (fastest first)"]
    # "per call": what every call pays; "run once": parameter casts and layout copies kept on the chip
    out += _table(rows, ("chip", "version", "precision", "per call", "run once", "off-chip per call",
                         "peak memory", "capacity", "kernels", "fused", "layout conversions", "fallbacks", "bound by"),
                  right=(3, 4, 5, 6, 7, 8, 9, 10, 11), optional=(9, 8, 7, 1, 10, 5))
    if errors:
        out.append(f"Not plannable ({len(errors)}):")
        out += errors
    return "\n".join(out)


def _decode_text(model, res) -> str:
    rows, errors = [], []
    for r in res["rows"]:
        if r["ok"]:
            mem = _b(r["peak_bytes"]) + (f" / {_b(r['capacity_bytes'])}" if r["capacity_bytes"] else "")
            rows.append((r["chip"], r["version"], r["precision"] or "-", _t(r["prefill_s"]), _t(r["decode_s"]),
                         f"{r['tokens_per_s']:,.1f}", _b(r["kv_cache_bytes"]), mem, r["fallbacks"],
                         f"{r['bound']} ({100 * r['bound_share']:.0f}%)"))
        else:
            errors += _para(f"{r['chip']} {r['version']}: {r['error_kind']}: {r['error'].splitlines()[0]}",
                            indent="  ", subsequent="    ")
    out = _para(f"{model}: batch {res['batch']}, prefill of {res['prompt']} tokens, decode at context "
                f"{res['context']} on {len(res['rows'])} chips, planned in {res['planning_s']:.1f} s (most tokens/s "
                "first; predicted)")
    out += _table(rows, ("chip", "version", "precision", "prefill", "per token", "tokens/s", "KV cache",
                         "peak memory", "fallbacks", "decode bound by"), right=(3, 4, 5, 6, 8), optional=(1, 8))
    if errors:
        out.append(f"Not plannable ({len(errors)}):")
        out += errors
    return "\n".join(out)


# ---------------------------------------------------------------- plan decode

@click.command("decode")
@click.argument("model")
@click.option("--chip", required=True, help="Chip name in the registry, e.g. TFL-X1.")
@click.option("--context", type=click.IntRange(min=2), required=True,
              help="Cached positions after the decode step (the KV cache's length).")
@_PROMPT
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Sequences decoded at once.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="auto", show_default=True,
              help="Precision policy; auto: none on chips with an fp32 unit, else float16 (or bfloat16).")
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@_guarded
def decode(model, chip, context, prompt, batch, precision, registry, as_json):
    """Predicted serving speed of the causal LM MODEL on --chip: the prefill latency of --prompt
    tokens (time to first token), the per-token decode latency at --context and tokens/s, the
    decode step's memory with its KV cache; then the decode step's plan."""
    from torchfl.planner import whatif

    module, _inputs = _load(model)
    dec = _decoder(model, module, False)
    target = whatif.chip_of(chip, registry)
    r = whatif.decode_row(target, dec, batch, prompt, context, _precision(precision))
    if as_json:
        _emit(dict(r, model=model))
        if not r["ok"]:
            sys.exit(1)
        return
    if not r["ok"]:
        _fail(r["error_kind"], r["error"])
    cap = f" of {_b(r['capacity_bytes'])}" if r["capacity_bytes"] else ""
    _echo(f"{model} on {r['chip']} {r['version']} (precision {r['precision'] or 'as captured'}, batch {batch}; "
          "predicted by the plans' cost model)")
    _echo(f"prefill of {prompt} tokens (time to first token): {_t(r['prefill_s'])}", indent="  ")
    _echo(f"decode at context {context}: {_t(r['decode_s'])} per token, {r['tokens_per_s']:,.1f} tokens/s "
          f"({r['bound']}-bound, {100 * r['bound_share']:.0f}% of the step's time)", indent="  ")
    _echo(f"decode step memory: peak {_b(r['peak_bytes'])}{cap}, KV cache {_b(r['kv_cache_bytes'])}; "
          f"{r['fallbacks']} fallbacks to CPU", indent="  ")


# ---------------------------------------------------------------- plan impact

@click.command("impact")
@click.option("--chip", required=True, help="Chip name in the registry.")
@click.option("--from", "v1", required=True, help="The version in use (e.g. 1.0.0).")
@click.option("--to", "v2", required=True, help="The new version.")
@click.option("--models", default="zoo", show_default=True,
              help="zoo (every zoo model), or comma-separated zoo names / path/to/file.py:factory.")
@_common
@cluster_option
@resume_option
@_guarded
def impact(chip, v1, v2, models, precision, training, registry, as_json, cluster, resume):
    """Field diff of two versions of --chip, then each model re-planned on both: changed plans
    (kernels, layouts, tilings, fusions), cost and memory deltas, new fallbacks or errors.
    Exit status 1 when a model that planned on --from no longer plans on --to.
    With --cluster, each model is a unit on the Ray cluster, recorded in the registry (--resume RUN)."""
    from torchfl.planner import whatif
    from torchfl.planner.zoo import ZOO

    require_ray(cluster)
    specs = list(ZOO) if models.strip() == "zoo" else [m.strip() for m in models.split(",") if m.strip()]
    if not specs:
        _fail("Error", f"--models {models!r} names no model; give zoo, or comma-separated zoo names / "
                       "path/to/file.py:factory", code=2)
    for version in (v1, v2):            # a version that does not exist is said before any model loads
        whatif.chip_of(chip, registry, version)
    if cluster is not None or resume is not None:
        from torchfl.cluster.whatif import check_model, sweep_impact

        for spec in specs:
            check_model(spec)
        res = _swept(cluster, resume, registry, lambda **kw: sweep_impact(
            chip, v1, v2, specs, precision=_precision(precision), training=training, **kw))
    else:
        loaded = [(spec, *_load(spec)) for spec in specs]
        res = whatif.impact(chip, v1, v2, loaded, registry, _precision(precision), training,
                            progress=None if as_json else _progress("impact"))
    if as_json:
        _emit(res.to_dict())
    else:
        click.echo(_impact_text(res))
    if res.broken:
        sys.exit(1)


def _impact_text(res) -> str:
    out = [f"{res.chip} {res.v1} -> {res.v2}: {len(res.changes)} field change(s)"]
    for c in res.changes:
        old = json.dumps(c.get("old")) if "old" in c else ""
        new = json.dumps(c.get("new")) if "new" in c else ""
        out += _para(f"{c['kind']:7}  {c['path']}: {old}{' -> ' if old and new else ''}{new}", indent="  ",
                     subsequent="           ")
    for m in res.models:
        b, a = m.before, m.after
        out.append("")
        status = impact_status(m)
        if status == "plans on neither":
            out += _para(f"{m.model}: {status} ({a['error_kind']}: {a['error'].splitlines()[0]})")
            continue
        if status == "BROKEN":
            out += _para(f"{m.model}: {status}: planned on {res.v1}, refused on {res.v2}: {a['error_kind']}: "
                         f"{a['error'].splitlines()[0]}")
            continue
        if status == "newly plannable":
            out += _para(f"{m.model}: {status} on {res.v2} (on {res.v1}: {b['error_kind']}: "
                         f"{b['error'].splitlines()[0]})")
            continue
        dt = a["per_call_time_s"] - b["per_call_time_s"]
        pct = 100 * dt / b["per_call_time_s"] if b["per_call_time_s"] else 0.0
        out += _para(f"{m.model}: {status}: per call {_t(b['per_call_time_s'])} -> {_t(a['per_call_time_s'])} "
                     f"({pct:+.1f}%), run once {_t(b['run_once_time_s'])} -> {_t(a['run_once_time_s'])}, "
                     f"off-chip per call {_b(b['per_call_bytes'])} -> {_b(a['per_call_bytes'])}, peak memory "
                     f"{_b(b['peak_bytes'])} -> {_b(a['peak_bytes'])}, fallbacks {b['fallbacks']} -> "
                     f"{a['fallbacks']}, {len(m.changed_steps)} op group(s) planned differently")
        for c in m.changed_steps[:12]:
            what = "; ".join(f"{k} {x} -> {y}" for k, (x, y) in c["changed"].items())
            out += _para(f"{c['nodes']}: {what}", indent="    ", subsequent="      ")
        if len(m.changed_steps) > 12:
            out.append(f"    ... and {len(m.changed_steps) - 12} more (--json lists all)")
        for f in m.new_fallbacks:
            out += _para(f"new fallback: {f['node']} ({f['op']}): {f['reason']}", indent="    ", subsequent="      ")
        for g in m.fusions_lost:
            out += _para(f"fusion lost: {g}", indent="    ", subsequent="      ")
    if res.broken:
        out.append("")
        out += _para(f"BROKEN on {res.v2}: {', '.join(res.broken)} (exit status 1)")
    return "\n".join(out)


# ---------------------------------------------------------------- plan report

@click.command("report")
@click.argument("model")
@click.option("--chip", default=None, help="The chip whose plan the page shows (default: the fastest of --chips).")
@click.option("--chips", default=None, help="Comma-separated chips to compare on the page ('all': the registry's).")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="The HTML file to write (self-contained: no network).")
@_model_options
@click.option("--precision", type=click.Choice(PRECISIONS), default="auto", show_default=True,
              help="Precision policy; auto: none on chips with an fp32 unit, else float16 (or bfloat16).")
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
@_guarded
def report(model, chip, chips, output, batch, seq_len, heads, layers, precision, registry):
    """One self-contained HTML page: the plan as a graph coloured by kernel family and
    fallback, a roofline of its steps, the memory timeline with the peak, the explain table;
    with --chips, the chips side by side too."""
    from torchfl.planner import whatif
    from torchfl.planner.report import ReportError, render_report

    if not chip and not chips:
        _fail("Error", "give --chip NAME (one plan) or --chips A,B,... (a comparison; 'all' for every chip)", code=2)
    out_path = _writable_output(output)   # before minutes of planning, not after
    names = _chip_names(None if chips == "all" else chips, registry) if chips else []
    if chip and chip not in names:
        names = [chip] + names
    targets = [whatif.chip_of(n, registry) for n in names]
    _check_batch(batch, targets, seq_len)
    module, inputs = _load(model, batch, seq_len, heads, layers)
    results = whatif.plan_everywhere(module, inputs, targets, _precision(precision))
    by_name = {t.name: t for t in targets}
    comparison = None
    if chips:
        rows = [whatif.row(p, by_name[p.chip]) for p in results]
        rows.sort(key=lambda r: (not r["ok"], r.get("per_call_time_s") or 0.0, r["chip"]))
        comparison = {"rows": rows}
    shown = next((p for p in results if p.chip == chip), None) if chip else \
        next((p for p in results if p.chip == comparison["rows"][0]["chip"]), None)
    if shown is None or not shown.ok:
        err = shown.error if shown is not None else None
        _fail(getattr(err, "kind", "Error"), f"no plan of {model} on {chip or 'any chip'} to show: {err}")
    try:
        page = render_report(shown.plan, by_name[shown.chip].model, f"{model} on {shown.chip}", comparison)
    except ReportError as exc:
        _fail("Error", str(exc))
    _write_atomically(out_path, page)
    click.echo(f"wrote {output} ({len(page) / 1024:.0f} KiB): {model} on {shown.chip}"
               + (f", {len(comparison['rows'])} chips compared" if comparison else ""))


COMMANDS = [memory, max_batch, max_context, decode, compare, impact, report]
