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
def explain(model, chip, batch, seq_len, heads, layers, precision, strict, fmt, registry, analyze, record, context,
            prompt) -> None:
    """Show the plan of MODEL (a zoo name: mlp, resnet18, resnet50, bert-base, bert-large,
    gpt2; or path/to/file.py:factory returning (module, example_inputs)) on --chip."""
    import os
    import warnings

    if record and not analyze:
        _fail("Error", "--record stores what a run measured: add --analyze")
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
    click.echo(result.explain(fmt), nl=False)
    if fmt == "text":
        click.echo(_checked(result, registry))


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
