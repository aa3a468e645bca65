"""``torchfl demo``: the main job end to end on the embedded default registry.

Creates (and seeds) the registry if needed, compiles the project's ResNet-50 (batch 1,
224x224) and a BERT encoder layer for NPU-V2 and NPU-V3 with precision float16 through
``torch.compile(backend="torchfl")``, runs them on the emulated chips, prints explain
analyze, compares with eager torch, and shows a hard-constraint error as a user meets it.
torch is imported inside the command only (the CLI's cold start stays small).

Numba compiles a kernel on one core and holds the GIL, so from a cold kernel cache most of
the demo is compiling. While this process compiles ResNet-50's kernels, a second process
(``--compile-only``) compiles the BERT layer's into the same Numba cache, from which this
process then loads them: on 2 cores the cold demo takes about the time of the larger of the
two compiles instead of their sum. Nothing depends on the second process: a kernel it has not
cached by then is compiled here as usual.
"""
from __future__ import annotations

import sys
import time

import click

from torchfl.cli.workloads import CHIPS, compile_model as _compile, first_tensor as _first_tensor


def _models(quick: bool):
    """(title, factory) pairs; factories return (module, inputs)."""
    from torchfl.cli.workloads import models

    return tuple((title, factory) for _key, title, factory in models(quick))


def _start_compile_worker(registry, quick: bool):
    """A lower-priority process that compiles the later models' kernels into the Numba cache
    (see the module docstring); None where it cannot start (then this process compiles all)."""
    import os
    import subprocess

    cmd = [sys.executable, "-m", "torchfl.cli", "demo", "--compile-only"]
    if quick:
        cmd.append("--quick")
    if registry:
        cmd += ["--registry", registry]
    try:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(5),
                                env=dict(os.environ, TORCHFL_COMPILE_HELPERS="0"))
    except OSError:
        return None


def _warmed_up(quick: bool) -> bool:
    """Whether ``torchfl kernels warmup`` compiled every demo job (then no compile worker); the
    full-size jobs serve ``--quick`` too (Numba specialises on types, not on sizes)."""
    from torchfl.cli.kernels_cmd import job_name, warmed_jobs
    from torchfl.cli.workloads import models
    from torchfl.kernels import jitcache

    done = warmed_jobs(jitcache.configure())
    return any(all(job_name(key, chip, q) in done for key, _t, _f in models(q) for chip in CHIPS)
               for q in {quick, False})


def _compile_only(registry, quick: bool) -> None:
    """The worker: the first call of every model after the first, on the first chip."""
    import torch

    for _name, factory in _models(quick)[1:]:
        module, inputs = factory()
        compiled = _compile(module, CHIPS[0], registry)
        with torch.no_grad():
            compiled(*inputs)


@click.command("demo")
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
@click.option("--quick", is_flag=True, help="Smaller inputs (64x64 images, 32 tokens): a faster tour.")
@click.option("--full-tables/--short-tables", default=False, show_default=True,
              help="Print every step of explain analyze (ResNet-50 has >100) or the slowest 12.")
@click.option("--parallel-compile/--no-parallel-compile", default=True, show_default=True,
              help="Compile the BERT layer's kernels in a second process while ResNet-50's compile here.")
@click.option("--compile-only", is_flag=True, hidden=True,
              help="(the second process) compile the later models' kernels into the Numba cache, print nothing.")
def demo(registry, quick, full_tables, parallel_compile, compile_only) -> None:
    """Compile ResNet-50 and a BERT layer for NPU-V2 and NPU-V3 (float16), run them on the
    emulated chips, explain analyze, check against eager torch, show a hard-constraint error."""
    import os
    import warnings

    os.environ.setdefault("TORCHDYNAMO_VERBOSE", "0")
    warnings.filterwarnings("ignore")
    if compile_only:
        _compile_only(registry, quick)
        return
    from rich.console import Console

    from torchfl.planner.texttable import terminal_width

    # soft_wrap off: a sentence longer than the width wraps at spaces (100 columns in a pipe);
    # the tables and explain texts are already fitted to it
    out = Console(highlight=False, soft_wrap=False, width=terminal_width())
    t_start = time.perf_counter()
    # 1. the registry: created and migrated if needed; bundled chips and packs imported
    #    (re-importing identical content is a no-op, so this is safe on every run)
    _show_registry(out, registry)
    # 2. compile, run, analyze, compare (the later models' kernels compiling in a second process)
    results = _run_models(out, registry, quick, parallel_compile)
    _print_results(out, results, full_tables)
    # 3. a hard constraint, as a user meets it: the transcript printed is the code run
    out.rule("[bold]A hard constraint, as a user meets it")
    ok_error = hard_constraint(out, registry)
    bad = _summary(out, results)
    out.print(f"demo finished in {time.perf_counter() - t_start:.1f} s")
    if bad or not ok_error:
        sys.exit(1)


def _show_registry(out, registry) -> None:
    """Open (create, migrate, seed) the registry and print its chips; exit 1 on a registry error."""
    from rich.table import Table

    from torchfl.registry import Registry, RegistryError

    try:
        reg = Registry(registry)
        seeded = reg.init(seed=True)["seeded"]
        chips = reg.chips()
        packs = reg.packs()
    except RegistryError as exc:
        out.print(f"[red]Error:[/red] {exc}")
        sys.exit(1)
    out.print(f"[bold]Registry[/bold] {reg.display_url}: {len(chips)} chips, {len(packs)} rule pack(s) "
              f"({seeded['added']} imported now, {seeded['unchanged']} already there)")
    t = Table(show_header=True, header_style="bold")
    for col in ("chip", "latest", "device_type", "vendor"):
        t.add_column(col)
    for s in chips:
        t.add_row(s.name, s.latest, str(s.device_type or ""), str(s.vendor or ""))
    out.print(t)


def _run_models(out, registry, quick: bool, parallel_compile: bool = True) -> list:
    """Each model on each chip: compiled, run, explained with analyze, compared with eager
    torch. Returns (chip, name, max |diff|, relative, failure, (first call s, analyses, text))."""
    worker = _start_compile_worker(registry, quick) if parallel_compile and not _warmed_up(quick) else None
    if worker is not None:
        out.print("Compiling the BERT layer's kernels in a second process (pid "
                  f"{worker.pid}) while ResNet-50's compile here")
    import torch

    from torchfl.cli.progress import Progress

    results = []
    jobs = [(chip, name, factory) for name, factory in _models(quick) for chip in CHIPS]
    from torchfl.cli.render import PipeLines

    with Progress(PipeLines(sys.stdout), "compile + run on the emulated chips", total=len(jobs) * 3) as progress:
        for chip, name, factory in jobs:
            progress.update(f"{name} on {chip}: building")
            module, inputs = factory()
            with torch.no_grad():
                ref = _first_tensor(module(*inputs))
            results.append(_run_one(progress, chip, name, module, inputs, ref, registry))
    if worker is not None and worker.poll() is None:
        worker.terminate()      # it has nothing left to give this run
        worker.wait()
    return results


def _run_one(progress, chip, name, module, inputs, ref, registry) -> tuple:
    """One model on one chip (a result row of :func:`_run_models`)."""
    import torch

    import torchfl

    compiled = _compile(module, chip, registry)
    progress.advance()
    progress.update(f"{name} on {chip}: planning + compiling kernels")
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            y = _first_tensor(compiled(*inputs))
    except (RuntimeError, NotImplementedError) as exc:
        progress.advance(2)
        return chip, name, None, None, f"{type(exc).__name__}: {exc}", None
    first_s = time.perf_counter() - t0
    progress.advance()
    progress.update(f"{name} on {chip}: explain analyze")
    text, analyses = torchfl.explain(compiled, *inputs, analyze=True, return_analysis=True)
    progress.advance()
    err = float((y.float() - ref.float()).abs().max())
    rel = err / max(float(ref.abs().max()), 1e-12)
    return chip, name, err, rel, None, (first_s, analyses, text)


def _print_results(out, results, full_tables: bool) -> None:
    for chip, name, err, rel, failure, extra in results:
        out.rule(f"[bold]{name} on {chip}, precision float16")
        if failure:
            out.print(f"[red]{failure}[/red]")
            continue
        first_s, analyses, text = extra
        for an in analyses:
            out.print(_short(an, full_tables), markup=False, soft_wrap=True)   # fitted by its renderer
        out.print(f"vs eager torch (float32): {accuracy_text(err, rel)}; "
                  f"first call (plan + kernel compile + run) {first_s:.1f} s")


def accuracy_text(err: float, rel: float) -> str:
    """The largest difference from eager and its share of the largest reference value, said so
    that neither number reads as the other ("relative to max |ref| 0.00053" read as if the
    reference's largest value were 0.00053)."""
    return f"largest |diff| {err:.3g} = {share(rel)} of the largest |output|"


def share(rel: float) -> str:
    """A ratio as a percentage, two significant digits (0.00053 -> 0.053%)."""
    return f"{100 * rel:.2g}%"


def _summary(out, results) -> list:
    """The summary table; returns the runs that failed or came too far from eager."""
    from rich.table import Table

    out.rule("[bold]Summary")
    t = Table(show_header=True, header_style="bold")
    for col in ("model", "chip", "nodes on chip / folded / CPU", "max |diff| vs eager", "of max |output|", "outcome"):
        t.add_column(col)
    bad = []
    for chip, name, err, rel, failure, extra in results:
        if failure:
            t.add_row(name, chip, "-", "-", "-", failure)
            bad.append(f"{name} on {chip}")
        else:
            outcome = "ok" if rel < 5e-2 else "TOO FAR from eager"
            if rel >= 5e-2:
                bad.append(f"{name} on {chip}")
            plans = [an.plan.summary for an in extra[1]]
            routes = (f"{sum(p.nodes_on_chip for p in plans)} / {sum(p.folded for p in plans)} / "
                      f"{sum(p.fallbacks for p in plans)}")
            t.add_row(name, chip, routes, f"{err:.3g}", share(rel), outcome)
    out.print(t)
    return bad


# The demo's hard-constraint transcript, in doctest form: printed as it is and run as it is
# (tests/cli/test_demo_transcript.py runs the printed text through doctest in a new
# interpreter). need_weights=False and no_grad: PyTorch then takes its fused attention path
# (scaled_dot_product_attention), which the chip's attention unit serves; with the attention
# weights asked for, or with autograd recording, the same module computes with bmm and
# softmax and plans without the unit (no error to show).
TRANSCRIPT = """\
>>> import torch
>>> mha = torch.nn.MultiheadAttention(768, 12, batch_first=True).eval()
>>> options = {"chip": "NPU-V2", "precision": "float16"}
>>> model = torch.compile(mha, backend="torchfl", options=options)
>>> x = torch.randn(1, 16, 768)
>>> with torch.no_grad():
...     y, _ = model(x, x, x, need_weights=False)
"""


def hard_constraint(out, registry, width: int = 100) -> bool:
    """Print TRANSCRIPT, run it (on ``registry``), print the exception as a Python session
    shows it (the message wrapped at spaces to ``width``). True if it raised NotImplementedError."""
    import doctest
    import os
    import textwrap
    import traceback

    out.print(TRANSCRIPT.rstrip("\n"), markup=False, highlight=False)
    saved = os.environ.get("TORCHFL_REGISTRY_URL")
    if registry:
        os.environ["TORCHFL_REGISTRY_URL"] = registry     # the transcript names no registry
    scope: dict = {}
    try:
        for example in doctest.DocTestParser().get_examples(TRANSCRIPT):
            exec(compile(example.source, "<demo>", "single"), scope)
    except NotImplementedError as exc:
        out.print("Traceback (most recent call last):\n  ...", markup=False, highlight=False)
        line = traceback.format_exception_only(exc)[-1].strip()   # as Python prints it
        out.print("\n".join(textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False)),
                  style="red", markup=False, highlight=False)
        return True
    finally:
        if registry:
            if saved is None:
                os.environ.pop("TORCHFL_REGISTRY_URL", None)
            else:
                os.environ["TORCHFL_REGISTRY_URL"] = saved
    out.print("unexpected: NPU-V2 accepted 12 heads", style="red", markup=False)
    return False


def _short(an, full: bool) -> str:
    """The analysis text; unless ``full``, only the 12 per-call steps with the largest simulated
    time (run-once steps, such as parameter casts, are not what a call costs)."""
    if full or len(an.steps) <= 16:
        return an.render()
    per_call = [s for s in an.steps if not an.static(s)]
    keep = {s.index for s in sorted(per_call, key=lambda s: -s.simulated_time_s)[:12]}
    return an.render(only=keep, omitted_note=(
        f"... the 12 slowest of {len(per_call)} per-call steps; {len(an.steps) - len(keep)} more, "
        f"{len(an.steps) - len(per_call)} of them run once (--full-tables: all)"))
