"""``torchfl conformance``: run OpInfo samples of every claimed overload on a chip, record
the verdicts as evidence in the registry, or print the evidence matrix (``--report``).

Thin: the work is :mod:`torchfl.conformance.harness` (torch is imported only when a run
starts). Progress: a bar on a terminal, timestamped lines otherwise.
"""

from __future__ import annotations

import os
import sys

import click

from torchfl.cli.registry_cmd import _emit_json, _fail, handles_errors, open_registry, registry_option
from torchfl.cluster.options import cluster_option, reported, require_ray, resume_option


class _Samples(click.ParamType):
    """A positive count or ``all`` (None: every OpInfo sample)."""

    name = "N|all"

    def convert(self, value, param, ctx):
        if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
            return None
        try:
            n = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is neither a positive count nor 'all'", param, ctx)
        if n < 1:
            self.fail(f"{n} is not a positive count (use 'all' for every sample)", param, ctx)
        return n


def _split(values) -> tuple:
    return tuple(v.strip() for item in values for v in item.split(",") if v.strip())


@click.command("conformance")
@click.option("--chip", "chips", multiple=True, metavar="NAME", help="Chip to test (repeat for several).")
@click.option("--all-chips", is_flag=True, help="Every chip in the registry.")
@click.option("--ops", "ops", multiple=True, metavar="PATTERN",
              help="Only these overloads: aten.add.Tensor, add, '*softmax*' (comma-separated or repeated).")
@click.option("--dtypes", "dtypes", multiple=True, metavar="D", help="Only these dtypes (float16, bfloat16, ...).")
@click.option("--samples", type=_Samples(), default="4", show_default=True,
              help="OpInfo samples per (OpInfo, dtype): a count, or 'all' for every sample op_db has.")
@click.option("--mode", "mode", type=click.Choice(["compile", "eager", "both"]), default="compile", show_default=True,
              help="Run the cases through torch.compile(backend='torchfl'), on the npu eager device "
                   "(TORCHFL_STRICT: no host fallback), or both; eager evidence is stored under layouts 'eager ...'.")
@click.option("--edge", "edge_from", type=click.IntRange(min=0), default=1, show_default=True,
              help="Edge-case variants (strided, channels_last, NaN/inf, empty, broadcast) of the first N samples.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes (default: the machine's cores, at most 4).")
@click.option("--no-record", is_flag=True, help="Do not store the run as evidence in the registry.")
@click.option("--report", is_flag=True, help="Print the stored evidence matrix (ops x chips) instead of running.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default=None,
              help="Output of --report (default text).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@cluster_option
@resume_option
@click.option("--sweeps", "list_sweeps", is_flag=True,
              help="List the recorded sweep runs (finished, or partial: finish one with --resume RUN).")
@registry_option
@handles_errors
def conformance(chips, all_chips, ops, dtypes, samples, mode, edge_from, jobs, no_record, report, fmt, as_json,
                cluster, resume, list_sweeps, registry_url):
    """Check that a chip does what its rules claim: every ATen overload the rule packs map on
    the chip runs PyTorch's OpInfo samples (and edge cases) strictly on the emulated chip,
    compared with eager torch; verdicts (pass / partial / fail / refused) are stored as
    evidence that `registry ops|support|why-not` show beside each claim."""
    from torchfl.rules.support import SupportError, normalise_dtype

    require_ray(cluster)
    reg = open_registry(registry_url)
    if list_sweeps:
        return _list_sweeps(reg, as_json)
    if resume is not None:   # the run says what it tests; flags that disagree are refused when it opens
        given = _given(dict(ops=ops, dtypes=dtypes, samples=samples, edge_from=edge_from, mode=mode))
        chips, all_chips, ops, dtypes, samples, edge_from, mode = _resumed(reg, resume, chips, all_chips, no_record,
                                                                           given)
    if report:
        from torchfl.conformance import matrix

        m = matrix.build(reg, chips or None)
        fmt = "json" if as_json else (fmt or "text")
        if fmt == "json":
            return _emit_json(m)
        click.echo(matrix.render_markdown(m) if fmt == "markdown" else _matrix_text(m, matrix))
        return
    if fmt:
        _fail("--format goes with --report; a run prints text, or JSON with --json", 1)
    names = [s.name for s in reg.chips()] if all_chips else list(chips)
    if not names:
        _fail("name a chip: --chip NAME (or --all-chips); `torchfl registry list` shows them", 1)
    try:
        wanted = tuple(normalise_dtype(d) for d in _split(dtypes))
    except SupportError as exc:
        _fail(str(exc), 1)
    for name in names:
        reg.record(name)  # unknown chip: one line with near matches, before torch is imported
    names, wanted = _refuse_missing_dtypes(reg, names, wanted)
    if not names:
        return
    _require_opinfo()
    from torchfl.conformance.harness import Settings

    from torchfl.cluster.options import runner as make_runner

    modes = ("compile", "eager") if mode == "both" else (mode,)
    jobs = jobs or min(4, os.cpu_count() or 1)
    runner = make_runner(cluster, jobs, echo=lambda line: click.echo(line, err=True))
    if cluster is not None:
        with reported():
            jobs = max(1, int(runner.connected_cpus()))   # refuses here when a node is not this torchfl
    settings = Settings(samples=samples, edge_from=edge_from, ops=_split(ops), dtypes=wanted, jobs=jobs, modes=modes)
    if "eager" in modes:   # in-process (--jobs 1) runs: the chips under test are npu devices
        os.environ.setdefault("TORCHFL_DEVICES", ",".join(names))
        os.environ.setdefault("TORCHFL_REGISTRY_URL", reg.url)
    clock = None
    try:
        if len(names) > 1 and cluster is None and resume is None:
            # several chips on this machine: one run shares what no chip changes (samples, eager
            # torch, traces, captures) and one worker pool (conformance/across.py)
            clock = _Clock()
            reports = _run_across(reg, names, settings, record=not no_record)
            clock.stop()
        else:
            reports = [_run_one(reg, name, settings, record=not no_record, quiet=as_json, runner=runner,
                                resume=resume) for name in names]
    finally:
        runner.close()
    if as_json:
        return _emit_json([r.as_dict() for r in reports] if len(reports) > 1 else reports[0].as_dict())
    for r in reports:
        _print_report(r)
    if clock is not None:
        cases = sum(r.counts()["cases"] + r.skipped for r in reports)
        click.echo(f"{len(reports)} chips together: {cases} chip-cases in {clock.wall:.0f} s, "
                   f"{clock.cpu:.0f} s of CPU (this process and its workers), load average "
                   f"{clock.load[0]:.1f} -> {clock.load[1]:.1f}")


def _refuse_missing_dtypes(reg, names, wanted):
    """(chips, dtypes) left to run once the asked dtypes a chip cannot compute at all are
    answered "refused" (the chip has no unit for them: every case would be refused, and the run
    answered "0 cases" with no verdict). A chip with no asked dtype left is not run."""
    if not wanted:
        return names, wanted
    from torchfl.cli.support_cmd import chip_lacks

    left = []
    for name in names:
        hcd = reg.chip(name)
        refused = {d: chip_lacks(hcd, d) for d in wanted if chip_lacks(hcd, d)}
        for d, why in refused.items():
            click.echo("\n".join(_paragraph(f"{name}: {d}: refused: {why}")))
        if len(refused) < len(wanted):
            left.append(name)
        else:
            click.echo(f"{name}: no asked dtype left to run; not recorded")
    runnable = tuple(d for d in wanted if any(not chip_lacks(reg.chip(n), d) for n in left))
    return left, runnable


def _paragraph(text: str) -> list[str]:
    from torchfl.planner.texttable import paragraph

    return paragraph(text, indent="", subsequent="    ")


def _require_opinfo() -> None:
    """Refuse a run before it starts when torch's OpInfo database cannot load: it imports
    ``expecttest`` (a test-only package, not a dependency of torch), and without it every case
    was reported skipped and the run recorded as "0 cases, unverified" with exit 0."""
    try:
        import torch.testing._internal.common_methods_invocations  # noqa: F401 - the import is the check
    except ModuleNotFoundError as exc:
        _fail(f"conformance runs PyTorch's OpInfo samples, which need the {exc.name} package: "
              "pip install 'torchfl[conformance]' (nothing was run or recorded)", 1)


class _Clock:
    """Wall time, CPU time of this process and its finished children (the pool's workers and
    their compile helpers), and the 1-minute load average at start and stop: a run's cost on a
    shared machine, in the run's own summary."""

    def __init__(self):
        import time

        self._t0, self._cpu0 = time.perf_counter(), self._cpu_now()
        self.load = (os.getloadavg()[0], None)
        self.wall = self.cpu = 0.0

    @staticmethod
    def _cpu_now() -> float:
        import resource

        return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                       resource.getrusage(resource.RUSAGE_CHILDREN)))

    def stop(self):
        import time

        self.wall = time.perf_counter() - self._t0
        self.cpu = self._cpu_now() - self._cpu0
        self.load = (self.load[0], os.getloadavg()[0])


def _run_one(reg, name, settings, *, record: bool, quiet: bool, runner, resume=None):
    from torchfl.cluster.conformance import ConformanceSweep

    sweep = ConformanceSweep(runner, registry=reg if record else None, resume=resume)
    with reported(lambda: sweep.sweep):
        report = _run_harness(reg, name, settings, sweep)
        report.run_id, _written = sweep.finish(report) if record else (None, False)
    return report


def _run_across(reg, names, settings, *, record: bool):
    from datetime import datetime

    from torchfl.conformance.across import run_chips

    def lines(done, total, unit, outcomes):
        counts = {}
        for o in outcomes:
            counts[o["status"]] = counts.get(o["status"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        click.echo(f"[{datetime.now():%H:%M:%S}] {done}/{total} {unit.label}: {summary}", err=True)

    return run_chips(names, registry=reg, settings=settings, progress=lines, record=record)


def _run_harness(reg, name, settings, sweep):
    from functools import partial

    from torchfl.conformance.harness import run as run_harness

    run = partial(run_harness, record=False, execute=sweep)
    tty = sys.stderr.isatty()
    if tty:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(f"{name}: starting workers", total=None)

            def progress(done, total, unit, outcomes):
                bar.update(task, completed=done, total=total, description=f"{name}: {unit.label}")

            return run(name, registry=reg, settings=settings, progress=progress)

    def lines(done, total, unit, outcomes):
        from datetime import datetime

        counts = {}
        for o in outcomes:
            counts[o["status"]] = counts.get(o["status"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        where = sweep.where.get(unit.label)
        click.echo(f"[{datetime.now():%H:%M:%S}] {name} {done}/{total} {unit.label}: {summary}"
                   + (f" ({where})" if where else ""), err=True)

    return run(name, registry=reg, settings=settings, progress=lines)


#: the options that decide a conformance sweep's units (parameter name -> its flag)
_SWEEP_FLAGS = {"ops": "--ops", "dtypes": "--dtypes", "samples": "--samples", "edge_from": "--edge", "mode": "--mode"}


def _given(values: dict) -> dict:
    """Those of ``values`` the user gave (command line or environment), not click's defaults."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return {k: v for k, v in values.items()
            if ctx.get_parameter_source(k) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}


def _show(value) -> str:
    if value is None:
        return "all"
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def _refuse_changed(run_id: int, given: dict, recorded: dict) -> None:
    """A resumed run is the sweep it was started as (docs/CLUSTER.md): an option given with
    another value than the run's is refused, naming each (it silently ran the run's before)."""
    from torchfl.rules.support import SupportError, normalise_dtype

    ours = dict(given)
    if "ops" in ours:
        ours["ops"] = _split(ours["ops"])
    if "dtypes" in ours:
        try:
            ours["dtypes"] = tuple(normalise_dtype(d) for d in _split(ours["dtypes"]))
        except SupportError as exc:
            _fail(str(exc), 1)
    changed = [f"{_SWEEP_FLAGS[k]} {_show(v)} (the run's: {_show(recorded[k])})" for k, v in ours.items()
               if v != recorded[k]]
    if changed:
        _fail(f"sweep run {run_id} was started with other options: {'; '.join(changed)}; a resumed run finishes the "
              f"same sweep: drop them (--resume {run_id} alone), or start a new run without --resume", 1)


def _resumed(reg, run_id, chips, all_chips, no_record, given=None):
    """(chips, all_chips, ops, dtypes, samples, edge_from, mode) of the conformance sweep ``run_id``;
    ``given``: the sweep options the user gave, refused where they differ from the run's."""
    from torchfl.registry.sweeps import Sweeps

    if no_record:
        _fail("--resume writes the missing units into the run's registry; drop --no-record", 1)
    run = Sweeps(reg).get(run_id)
    if run.kind != "conformance":
        _fail(f"sweep run {run_id} is a {run.kind} sweep ({run.label}); resume it with the command that started it", 1)
    chip = run.spec["chip"]
    if run.status == "finished":
        click.echo(f"sweep run {run_id} ({run.label}) was finished already: conformance run "
                   f"{run.outcome.get('conformance_run')}; nothing to do")
        sys.exit(0)
    if all_chips or (chips and tuple(chips) != (chip,)):
        _fail(f"sweep run {run_id} tests {chip} only; resume it with --resume {run_id} (and no other chip)", 1)
    sampling = run.spec["sampling"]
    modes = tuple(sampling.get("modes", ("compile",)))
    recorded = dict(ops=tuple(run.spec["ops"]), dtypes=tuple(run.spec["dtypes"]), samples=sampling["samples"],
                    edge_from=sampling["edge_from"], mode="both" if len(modes) > 1 else modes[0])
    _refuse_changed(run_id, given or {}, recorded)
    return ((chip,), False, recorded["ops"], recorded["dtypes"], recorded["samples"], recorded["edge_from"],
            recorded["mode"])


def _list_sweeps(reg, as_json: bool) -> None:
    from torchfl.registry.sweeps import Sweeps

    runs = Sweeps(reg).runs()
    if as_json:
        return _emit_json([r.as_dict() for r in runs])
    if not runs:
        click.echo(f"no sweep runs in {reg.display_url}")
        return
    click.echo("\n".join(sweeps_table(runs)))


def sweeps_table(runs) -> list[str]:
    """The recorded sweep runs as a table with a header; a label that starts with its kind
    ("conformance TFL-X1 ...") loses that word (the row read "conformance conformance TFL-X1")."""
    from torchfl.planner.texttable import table

    rows = []
    for r in runs:
        what = r.label[len(r.kind):].strip() if r.label.startswith(r.kind + " ") else r.label
        if r.status == "finished":
            state = f"finished {r.finished_at:%Y-%m-%d %H:%M}"
            if r.outcome and "conformance_run" in r.outcome:
                state += f" (conformance run {r.outcome['conformance_run']})"
        else:
            state = f"{r.status}: finish it with --resume {r.id}"
        rows.append((str(r.id), r.kind, what, f"{r.done}/{len(r.units)}", state))
    return table(("run", "kind", "what", "units", "status"), rows, right=(0, 3), shrink_first=(2,))


def _print_report(r) -> None:
    from torchfl.planner.texttable import paragraph, table, terminal_width

    c = r.counts()
    ident = r.identity
    click.echo("\n".join(paragraph(
        f"{ident.chip_name} {ident.chip_version} (sha256:{ident.chip_hash[:12]}), packs "
        + ", ".join(f"{n} {v}" for n, v, _h in ident.packs) + f", torchfl {ident.tool_version}, "
        f"harness {r.harness_hash[:12]}")))
    click.echo("\n".join(paragraph(
        f"overloads: {c['pass']} verified, {c['partial']} partial, {c['fail']} failing, "
        f"{c['refused']} refused, {c['unverified']} unverified; {c['cases']} cases "
        f"(+{r.skipped} skipped) in {r.wall_s:.0f} s with {r.settings.jobs} worker(s)"
        + (f" (a run of several chips; this chip's share: {r.cpu_s:.0f} s of worker CPU)" if r.cpu_s is not None
           else "")
        + (f"; recorded as run {r.run_id}" if r.run_id is not None else "; not recorded"), indent="  ")))
    for f in r.findings:
        click.echo("\n".join(paragraph(f"FLAG native bfloat16: {f.message}", indent="  ", subsequent="    ")))
    bad = [x for x in r.results if x["verdict"] != "pass"]
    if bad:
        # every word of the reason, wrapped at spaces (--json has the whole reason text)
        rows = [(x["op"], x["dtype"], x["layout"], x["verdict"],
                 f"{x['passed']}/{x['samples']} pass, {x['failed']} fail, {x['refused']} refused: "
                 f"{' '.join(_gist(x['reason'] or '').split())}") for x in bad]
        for line in table(("op", "dtype", "layout", "verdict", "samples and why"), rows, shrink_first=(4,),
                          width=terminal_width() - 2):
            click.echo("  " + line)
    if r.unverified:
        ops = sorted({op for op, _d in r.unverified})
        click.echo("\n".join(paragraph(f"unverified (no OpInfo sample exercised them): {', '.join(ops)}",
                                       indent="  ", subsequent="    ")))


def _gist(reason: str) -> str:
    """The line that says why: a strict refusal's first listed op, else the first line."""
    lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].startswith("strict"):
        return lines[1]
    return lines[0] if lines else ""


def _matrix_text(m: dict, matrix) -> str:
    """The evidence matrix fitted to the terminal (100 columns in a pipe): as many chips side
    by side as fit, the rest in further tables below (op names repeated); nothing is cut."""
    from torchfl.planner.texttable import table, terminal_width

    width = terminal_width()
    names = [c["name"] for c in m["chips"]]
    ops = [r["op"] for r in m["ops"]]
    op_w = min(max([len(o) for o in ops] + [2]), max(24, width // 2))
    groups, group, used = [], [], op_w
    for n in names:
        need = 2 + max(len(n), 8)
        if group and used + need > width:
            groups.append(group)
            group, used = [], op_w
        group.append(n)
        used += need
    if group:
        groups.append(group)
    lines = []
    for k, chips in enumerate(groups):
        if k:
            lines.append("")
        rows = [(r["op"], *(matrix._cell(r["cells"][n]) for n in chips)) for r in m["ops"]]
        lines += table(("op", *chips), rows, width=width)
    lines.append("")
    for n in names:
        t = m["totals"][n]
        lines.append(f"{n}: " + ", ".join(f"{t[s]} {s}" for s in matrix.STATES))
    return "\n".join(lines)
