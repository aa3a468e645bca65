"""What every what-if command shares: its options, the one-line failure (never a traceback),
the model's loading, text and JSON output, progress notes, the chips and the cluster sweep."""

from __future__ import annotations

import functools
import json
import sys

import click

from torchfl.hcd.dtypes import PRECISION_CHOICES


def model_options(f):
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


def common_options(f):
    for opt in reversed((
        click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="auto", show_default=True,
                     help="Precision policy; auto: none on chips with an fp32 unit, else float16 (or bfloat16)."),
        click.option("--training", is_flag=True, help="Plan a training step (forward and backward graphs)."),
        click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's)."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text."),
    )):
        f = opt(f)
    return f


def fail(kind: str, message: str, code: int = 1) -> None:
    """One line on stderr (a multi-line message keeps its first line), then exit ``code``."""
    first = message.strip().splitlines()[0] if message.strip() else kind
    click.echo(f"{kind}: {first}", err=True)
    sys.exit(code)


def guarded(f):
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
            fail("Error", str(exc))
        except PlanError as exc:
            fail(exc.kind, str(exc))
        except RegistryError as exc:
            fail("Error", str(exc))
        except CaptureError as exc:   # the model does not run on its example inputs (a wrong shape, ...)
            fail("Error", f"the model could not be captured on its example inputs: {exc}")

    return wrapper


def precision_of(value: str):
    return None if value == "none" else value


def load(model, batch=None, seq_len=None, heads=None, layers=None):
    """(module, example inputs) of a zoo name or a user's ``file.py:factory``; what a user's
    model gets wrong is a ModelError, one line (:mod:`torchfl.cli.usermodel`)."""
    from torchfl.cli.usermodel import load_user_model

    return load_user_model(model, batch=batch, seq_len=seq_len, num_heads=heads, layers=layers)


def check_batch(batch, targets, seq_len=None) -> None:
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
            fail("RuntimeError", f"{label} {value:,} exceeds {field} {n:,} of {chips} (HCD field "
                                  f"constraints.{field}); use {option} {n} or less")


def output_path(output: str):
    """The resolved path of ``-o``, after checking it can be written (before any planning)."""
    from torchfl.cli.files import OutputError, writable_output

    try:
        return writable_output(output)
    except OutputError as exc:
        fail("Error", str(exc))


def write_report(path, text: str) -> None:
    """``text`` to ``path`` by a temporary file and a rename (a full disk keeps the old report)."""
    from torchfl.cli.files import OutputError, write_atomically

    try:
        write_atomically(path, text)
    except OutputError as exc:
        fail("Error", str(exc))


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def show_bytes(n) -> str:
    from torchfl.kernels.units import fmt_bytes

    return "-" if n is None else fmt_bytes(n)


def show_time(s) -> str:
    from torchfl.planner.texttable import human_time

    return "-" if s is None else human_time(s)


def text_table(rows, header, right=(), optional=(), indent: int = 0) -> list[str]:
    """Rows fitted to the terminal (100 columns in a pipe) after ``indent`` columns, wrapping
    at spaces, never cutting."""
    from torchfl.planner.texttable import table, terminal_width

    return table(header, [tuple(str(c) for c in r) for r in rows], right=right, optional=optional,
                 width=terminal_width() - indent)


def para(text: str, indent: str = "", subsequent: str | None = None) -> list[str]:
    from torchfl.planner.texttable import paragraph

    return paragraph(text, indent=indent, subsequent=subsequent)


def echo_wrapped(text: str, indent: str = "") -> None:
    """One sentence, wrapped at spaces to the terminal (100 columns in a pipe)."""
    click.echo("\n".join(para(text, indent=indent, subsequent=indent + "  ")))


def impact_status(m) -> str:
    """One model's outcome, in the words the result and the progress lines both use."""
    b, a = m.before["ok"], m.after["ok"]
    if b and a:
        return "plans on both"
    if b:
        return "BROKEN"
    return "newly plannable" if a else "plans on neither"


def progress_notes(label):
    """A one-line progress note per probe/chip on stderr (planning takes seconds each)."""
    def note(item):
        text = getattr(item, "batch", None)
        if text is not None:
            state = "fits" if item.ok else f"refused ({item.limit})"
            click.echo(f"{label}: batch {item.batch}: {state}, peak {show_bytes(item.peak_bytes)} ({item.seconds:.1f} s)",
                       err=True)
        else:
            click.echo(f"{label}: {item.model}: {impact_status(item)}", err=True)
    return note


CONTEXT = click.option("--context", type=click.IntRange(min=2), default=None,
                        help="A causal LM's decode step at this context (cached positions, KV cache included).")


PROMPT = click.option("--prompt", type=click.IntRange(min=1), default=128, show_default=True,
                       help="With --context: the prompt length whose prefill is timed.")


def decoder_of(model, module, training, asked_by: str = "--context"):
    """The what-if Decoder of MODEL (a causal LM; inference only). ``asked_by``: what the user
    typed that needs one, named in the refusal (`plan max-context resnet50` complained about a
    --context the user never gave)."""
    from torchfl.planner import whatif
    from torchfl.planner.lm import is_causal_lm

    if training:
        fail("Error", f"{asked_by} plans a decoder's inference step; leave out --training")
    if not is_causal_lm(module):
        fail("Error", f"{asked_by} needs a causal language model (a Hugging Face *ForCausalLM); {model} is a "
                       f"{type(module).__name__}")
    return whatif.Decoder(module)


def precision_text(precision, module) -> str:
    """The precision a what-if planned at, in words: the policy's dtype, or the dtype the
    model's weights were captured in (``float16 weights``; it read "as captured",
    which left the user to guess what that was)."""
    if precision:
        return precision
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in module.parameters() if p.is_floating_point()})
    return f"{', '.join(dtypes)} weights" if dtypes else "as captured"


def swept(cluster, resume, registry, call):
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


def chip_names(chips, registry) -> list[str]:
    from torchfl.planner.target import registered_chips

    if chips:
        names = [c.strip() for c in chips.split(",") if c.strip()]
        if not names:
            fail("Error", "--chips is empty; give comma-separated chip names, e.g. --chips NPU-V2,NPU-V3")
        return names
    return registered_chips(registry)
