"""``torchfl plan explain MODEL --chip NAME``: the SME's plan for a zoo model or a user's factory.

torch and the planner are imported inside the command, so ``torchfl --help`` stays fast.
Errors a user can fix (unknown model/chip, a chip's hard constraint, strict fallbacks) are
printed as one ``Kind: message`` line on stderr with exit code 1, never a traceback.
"""

from __future__ import annotations

import sys

import click

from torchfl.hcd.dtypes import PRECISION_CHOICES

# load_model's option -> the flag that sets it (errors name the flag the user wrote)
OPTION_FLAGS = {"batch": "--batch", "seq_len": "--seq-len", "num_heads": "--heads", "layers": "--layers"}


@click.group()
def plan() -> None:
    """Plan models on a chip with the cost-based SME and explain the decisions."""


@plan.command()
@click.argument("model")
@click.option("--chip", required=True, help="Chip name in the registry, e.g. NPU-V3.")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Batch size of the example input.")
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="Sequence length (BERT, GPT-2).")
@click.option("--heads", type=click.IntRange(min=1), default=None, help="Attention heads (BERT, GPT-2).")
@click.option("--layers", type=click.IntRange(min=1), default=None, help="Encoder/decoder layers (BERT, GPT-2).")
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="auto",
              show_default=True, help="Precision policy; auto: none on chips with an fp32 unit, else float16 (or "
                                      "bfloat16), as the what-if commands plan.")
@click.option("--strict", is_flag=True, help="Fail instead of falling back to the CPU for any op.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "dot"]), default="text", show_default=True)
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
@click.option("--analyze", is_flag=True,
              help="Execute the plan on the emulated chip; show predicted beside measured per step.")
@click.option("--record", is_flag=True,
              help="With --analyze: store the run's route counts (kernel, fold, fallback per ATen op) in the "
                   "registry; `torchfl registry routes --chip NAME` shows them over time.")
@click.option("--context", type=click.IntRange(min=2), default=None,
              help="A causal LM: predicted prefill latency, per-token decode latency and tokens/s at this context, "
                   "then the plan of the decode step (KV cache as its inputs and outputs).")
@click.option("--prompt", type=click.IntRange(min=1), default=128, show_default=True,
              help="With --context: the prompt length whose prefill is timed.")
@click.option("--top", type=click.IntRange(min=1), default=None, metavar="N",
              help="The summary first, then only the N slowest per-call steps (a big model's plan has thousands).")
def explain(model, chip, batch, seq_len, heads, layers, precision, strict, fmt, registry, analyze, record, context,
            prompt, top) -> None:
    """Show the plan of MODEL on --chip: a zoo name (mlp, resnet18, resnet50, bert-base,
    bert-large, gpt2; causal LMs: llama-7b, llama-70b, the published LLaMA-2 configs with
    float16 weights on the meta device, and tiny-llama, 2 small layers with weights) or
    path/to/file.py:factory returning (module, example_inputs). --top N: the summary and the
    N slowest steps only."""
    import os
    import warnings

    if record and not analyze:
        _fail("Error", "--record stores what a run measured: add --analyze")
    if top is not None and (fmt != "text" or analyze):
        _fail("Error", "--top shortens the text plan; leave out --format json|dot and --analyze")
    os.environ.setdefault("TORCHDYNAMO_VERBOSE", "0")
    warnings.filterwarnings("ignore")
    from torchfl.cli.usermodel import load_user_model
    from torchfl.planner import plan_module
    from torchfl.planner.capture import CaptureError
    from torchfl.planner.errors import PlanError
    from torchfl.planner.zoo import ModelError
    from torchfl.registry import RegistryError

    try:
        module, inputs = load_user_model(model, batch=batch, seq_len=seq_len, num_heads=heads, layers=layers,
                                         labels=OPTION_FLAGS)
        target, precision = _target_and_precision(chip, precision, registry)
        if context:
            result, inputs = _decode_step(model, module, target, batch or 1, prompt, context, precision, fmt)
        else:
            result = plan_module(module, inputs, chip=target, precision=precision, strict=strict, registry=registry)
    except ModelError as exc:
        _fail("Error", str(exc))
    except PlanError as exc:
        _fail(exc.kind, str(exc))
    except CaptureError as exc:   # the model runs on its inputs but does not trace as one graph
        _fail("Error", f"the model could not be captured on its example inputs: {exc}")
    except RegistryError as exc:   # registry unreachable: one line, the fix in it
        _fail("Error", str(exc))
    if analyze:
        if fmt == "dot":
            _fail("Error", "--analyze prints text or json; use --format text or --format json")
        analysed = _analyze(result, inputs)
        if record:
            _record_routes(result, analysed, model, precision, registry)
        if fmt == "json":
            import json

            click.echo(json.dumps(analysed.to_dict(), indent=2, sort_keys=True))
        else:
            click.echo(result.explain("text"), nl=False)
            click.echo(_checked(result, registry))
            click.echo(analysed.render())
        return
    if fmt == "json" and top is None:
        click.echo(_json_with_confidence(result, registry))
        return
    click.echo(top_text(result, top) if top is not None else result.explain(fmt), nl=False)
    if fmt == "text":
        click.echo(_checked(result, registry))
        if top is None and len(result.steps) > LONG_PLAN_STEPS:   # the last line a terminal shows
            click.echo(f"({len(result.steps)} steps: `--top 20` shows the summary first and the 20 slowest "
                       "steps only)")


# a plan longer than this many steps ends with the hint to --top
LONG_PLAN_STEPS = 100


def top_text(plan, n: int, width: int | None = None) -> str:
    """A long plan read from the top: the summary (headline, policy, per-call and run-once
    totals, memory, fallbacks) first, then the ``n`` per-call steps with the largest predicted
    time, slowest first, and what was left out. Why: `plan explain bert-base` is thousands of
    lines; the steps that cost the time are a handful of them."""
    from torchfl.planner.explain import _covers, _layout, human_time, memory_line, tiling_text
    from torchfl.planner.texttable import paragraph, table, terminal_width

    width = terminal_width() if width is None else width
    s = plan.summary
    per_call = [st for st in plan.steps if not st.static]
    once = len(plan.steps) - len(per_call)
    pol = f"precision policy {plan.precision}" if plan.precision else "no precision policy (graph dtypes as written)"
    lines = paragraph(s.headline(plan.chip), width=width)
    lines += paragraph(f"Plan for {plan.chip} {plan.chip_version}; {pol}; {len(plan.steps)} steps "
                       f"({len(per_call)} per call, {once} run once)", width=width)
    lines += paragraph(f"Per call: predicted {human_time(s.per_call_time_s)}, {_mib(s.per_call_bytes)} off-chip; "
                       f"run once: {human_time(s.run_once_time_s)}, {_mib(s.run_once_bytes)}", width=width)
    if plan.memory is not None:
        lines += paragraph(memory_line(plan), width=width)
    if plan.fallbacks:
        lines += paragraph(f"Fallbacks to CPU ({len(plan.fallbacks)}): "
                           + ", ".join(f"{f.node} ({f.op})" for f in plan.fallbacks[:5])
                           + (" ..." if len(plan.fallbacks) > 5 else ""), width=width)
    total = s.per_call_time_s or 1.0
    by_kernel: dict = {}
    for st in per_call:
        k = st.kernel or ("host" if st.kind == "fold" else "cpu")
        t, c = by_kernel.get(k, (0.0, 0))
        by_kernel[k] = (t + st.predicted_time_s, c + 1)
    ranked = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])
    lines += paragraph("Per-call time by kernel: " + ", ".join(
        f"{k} {100 * t / total:.0f}% ({c} steps)" for k, (t, c) in ranked[:6])
        + (f", {len(ranked) - 6} more kernels" if len(ranked) > 6 else ""), width=width)
    slow = sorted(per_call, key=lambda st: -st.predicted_time_s)[:n]
    share = sum(st.predicted_time_s for st in slow) / total
    lines += paragraph(f"The {len(slow)} slowest of {len(per_call)} per-call steps, {100 * share:.0f}% of the "
                       "per-call time:", width=width)
    rows = [(str(st.index), st.kind, st.kernel or ("host" if st.kind == "fold" else "cpu"), _covers(st), _layout(st),
             st.dtype, tiling_text(st.tile), human_time(st.predicted_time_s),
             f"{100 * st.predicted_time_s / total:.1f}%") for st in slow]
    lines += table(("#", "kind", "kernel", "covers", "layout", "dtype", "tiling", "time", "share"), rows,
                   right=(0, 7, 8), shrink_first=(3, 4), width=width)
    left = len(plan.steps) - len(slow)
    lines += paragraph(f"... {left} more steps (without --top: every step, the legend, the rejected alternatives; "
                       "--format json: all of it)", width=width)
    return "\n".join(lines) + "\n"


def _mib(n) -> str:
    from torchfl.planner.explain import _bytes

    return _bytes(n)


def _json_with_confidence(plan, registry) -> str:
    """The plan's JSON with its ``confidence`` beside it (what the text's Confidence and Fidelity
    lines say: the share of the per-call time priced from assumed or unstated numbers, and the
    chip's out-of-sample check in ``registry``), as the what-if commands' JSON carries it. The
    plan's own keys are unchanged (``Plan.from_dict`` reads them back)."""
    import json

    from torchfl.planner.confidence import confidence, fidelity_evidence

    data = json.loads(plan.explain("json"))
    target = getattr(plan, "target", None)
    if target is not None:
        data["confidence"] = confidence(plan, target, fidelity_evidence(registry, [plan.chip])[plan.chip]).to_dict()
    return json.dumps(data, sort_keys=True, indent=2)


def _checked(plan, registry) -> str:
    """How well this chip's predicted times are checked against published measurements
    (the latest ``torchfl fidelity --record`` run in the registry), as one sentence."""
    from torchfl.registry import Registry, RegistryError
    from torchfl.registry.fidelity import checked_line, fidelity_summary

    try:
        with Registry(registry) as reg:
            line = "Fidelity: " + checked_line(fidelity_summary(reg, plan.chip))
    except RegistryError as exc:
        line = f"Fidelity: {plan.chip}: unknown ({str(exc).splitlines()[0]})"
    from torchfl.planner.texttable import paragraph

    return "\n".join(paragraph(line))           # the terminal's width, 100 columns in a pipe


def _decode_step(model, module, target, batch, prompt, context, precision, fmt):
    """A causal LM's decode step at ``context`` planned on ``target`` (and its prefill, for the
    predicted serving speed printed first with ``--format text``): (plan, its inputs)."""
    from torchfl.planner import whatif
    from torchfl.planner.lm import is_causal_lm

    if not is_causal_lm(module):
        _fail("Error", f"--context needs a causal language model (a Hugging Face *ForCausalLM); {model} is a "
                       f"{type(module).__name__}")
    dec = whatif.Decoder(module)
    plans: dict = {}
    row = whatif.decode_row(target, dec, batch, prompt, context, precision, keep=plans)
    if not row["ok"]:
        _fail(row["error_kind"], row["error"])
    if fmt == "text":
        speed = (f"{row['decode_s'] * 1e3:.3g} ms per token, {row['tokens_per_s']:,.1f} tokens/s"
                 if row["tokens_per_s"] is not None else
                 f"at least {row['decode_s'] * 1e3:.3g} ms per token ({row['decode_fallbacks']} CPU fallbacks a "
                 "step: their host work is not priced, no tokens/s)")
        from torchfl.planner.texttable import paragraph

        click.echo("\n".join(paragraph(
            f"Decoder {model}, batch {batch} (predicted; {row['assumes']}): prefill of {prompt} tokens "
            f"{row['prefill_s'] * 1e3:.3g} ms (time to first token); decode at context {context}: {speed}; KV cache "
            f"{row['kv_cache_bytes'] / 2**20:.2f} MiB. The decode step's plan:")))
    return plans["decode"], dec.step_inputs(batch, context, meta=False)


def _target_and_precision(chip, precision, registry):
    """The resolved chip and the policy ``--precision`` names on it (``auto`` as the what-if
    commands resolve it, ``none``: the graph's dtypes as written)."""
    from torchfl.planner.target import resolve_target
    from torchfl.planner.whatif import auto_precision

    target = resolve_target(chip, registry)
    return target, (None if precision == "none" else auto_precision(target.hcd, precision))


def _record_routes(plan, analysed, model, precision, registry) -> None:
    """Route accounting over time: one append-only route run in the registry."""
    from torchfl.registry import Registry, RegistryError

    try:
        reg = Registry(registry)
        identity = reg.identity(plan.chip, plan.chip_version)
        if plan.chip_hash and identity.chip_hash != plan.chip_hash:
            _fail("Error", f"the plan's chip {plan.chip} {plan.chip_version} differs from the registry's published "
                           "one (content hash); nothing recorded")
        run = reg.record_routes(identity, model=model, precision=precision, routes=analysed.routes)
    except RegistryError as exc:
        _fail("Error", str(exc))
    click.echo(f"recorded the route counts as route run {run} in {reg.display_url}", err=True)


def _analyze(plan, inputs):
    """Run the plan once with progress on stderr (the first call of each kernel JIT-compiles)."""
    import torch.utils._pytree as pytree

    from torchfl.cli.progress import Progress
    from torchfl.runtime.analyze import analyze

    flat = pytree.tree_leaves(inputs)
    with Progress(sys.stderr, "explain analyze: running the plan", total=len(plan.steps)) as progress:

        def on_step(done, total, step):
            progress.update(completed=done, total=total, detail=f"last {step.kernel or step.kind}")

        return analyze(plan, flat, progress=on_step)


def _fail(kind: str, message: str) -> None:
    click.echo(f"{kind}: {message}", err=True)
    sys.exit(1)
