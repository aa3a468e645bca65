"""``torchfl fidelity``: score the planner's predicted times against tables of measured ones.

Default tables: the published ones bundled with torchfl (``measurements/*.csv``). Each row is
planned as a one-op graph on the chip it names (resolved in the registry) and its per-call
predicted time compared with the measured one; scores per chip and op family (``--by-source``:
per row source), rows a chip number was fitted on (in-sample) apart from the others. ``--record``
keeps each chip's run as evidence in the registry (``plan explain`` then says how well the
chip's predictions are checked). torch and the planner are imported inside the command.
"""
from __future__ import annotations

import json
import sys

import click

from torchfl.cluster.options import cluster_option, require_ray, resume_option


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


@click.command()
@click.option("--table", "tables", multiple=True, type=click.Path(dir_okay=False),
              help="A fidelity CSV (chip,op,shapes,dtype,args,seconds,source); repeat for several. "
                   "Default: the published tables bundled with torchfl.")
@click.option("--chip", default=None, help="Score only this chip's rows.")
@click.option("--json", "as_json", is_flag=True, help="Print scores and every row's prediction as JSON.")
@click.option("--record", is_flag=True, help="Store each chip's run as fidelity evidence in the registry.")
@click.option("--worst", type=click.IntRange(min=0), default=3, show_default=True,
              help="Worst rows listed per chip and family.")
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
@click.option("--calibrate-on", "calibrate_on", multiple=True, type=click.Path(exists=True),
              help="Microbenchmark tables (files or directories of CSVs; repeat for several): derive each chip's "
                   "sustained rates and launch costs from them, score the --table tables with the calibrated "
                   "chips; the microbenchmark rows are scored in-sample.")
@click.option("--by-source", "by_source", is_flag=True,
              help="Group scores by each row's source id (the tables' header comments name them), not op family.")
@click.option("--host", is_flag=True, help="Probe this machine (hcd probe), time torch's own eager ops on it "
              "(the ops of ResNet-50 b1 and a BERT layer, plain tables) and score the probe's HCD against them.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --host: torch threads (1: one core's CPU time, steady on a busy machine).")
@click.option("--quick", is_flag=True, help="With --host: small stand-ins of the models, fewer runs (seconds).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="With --host: keep the probe's HCD and the host tables in this directory.")
@cluster_option
@resume_option
def fidelity(tables, chip, as_json, record, worst, registry, calibrate_on, by_source, host, threads, quick, out_dir,
             cluster, resume) -> None:
    """Score predicted against measured op times, per chip and op family. With --cluster, each
    chip's rows are a unit on the Ray cluster, recorded in the registry (--resume RUN)."""
    import os
    import warnings

    os.environ.setdefault("TORCHDYNAMO_VERBOSE", "0")
    warnings.filterwarnings("ignore")
    require_ray(cluster)
    if calibrate_on and (host or record or cluster is not None or resume is not None):
        click.echo("error: --calibrate-on scores calibrated copies of the registry's chips; --record, --host, "
                   "--cluster and --resume go without it (record the published chips apart)", err=True)
        sys.exit(2)
    if host and (cluster is not None or resume is not None):
        click.echo("error: --host times this machine; --cluster/--resume go without it", err=True)
        sys.exit(2)
    if host:
        return _host(tables, chip, as_json, record, worst, registry, threads, quick, out_dir)
    if threads != 1 or quick or out_dir:
        click.echo("error: --threads, --quick and --out go with --host", err=True)
        sys.exit(2)
    from torchfl.fidelity.tables import TableError, bundled_tables, load_tables
    from torchfl.registry import RegistryError

    try:
        calibration_tables = load_tables(_csv_files(calibrate_on)) if calibrate_on else []
        loaded = calibration_tables + load_tables(tables or bundled_tables())
    except TableError as exc:
        for problem in exc.problems:
            click.echo(f"error: {problem}", err=True)
        sys.exit(2)
    if chip is not None and not any(r.chip == chip for t in loaded for r in t.rows):
        names = sorted({r.chip for t in loaded for r in t.rows})
        click.echo(f"error: no row of the tables is for chip {chip!r}; their chips: {', '.join(names)}", err=True)
        sys.exit(1)
    try:
        result = _score(loaded, chip, registry, worst, calibration_tables) if cluster is None and resume is None \
            else _swept(loaded, chip, registry, worst, cluster, resume)
        if by_source:
            result.by = "source"
            result.finish(worst)
        runs = _record(result, registry) if record else {}
    except RegistryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    calibrations = result.calibrations
    if as_json:
        out = result.as_dict()
        out["recorded_runs"] = runs
        if calibrate_on:
            out["calibration"] = {name: cal.as_dict(hcd) for name, (cal, hcd) in sorted(calibrations.items())}
        click.echo(json.dumps(out, indent=2, sort_keys=True))
    else:
        if calibrate_on:
            _print_calibration(calibrations)
        _print(result, worst, runs)
    if not any(s.rows for s in result.scores):
        sys.exit(1)


def _csv_files(paths) -> list:
    """The CSV files of ``paths``: a file as given, a directory's ``*.csv`` sorted by name."""
    from pathlib import Path

    out = []
    for p in map(Path, paths):
        out.extend(sorted(p.glob("*.csv")) if p.is_dir() else [p])
    return out


def _score(loaded, chip, registry, worst, calibration_tables=()):
    from torchfl.cli.progress import Progress
    from torchfl.fidelity.calibrate import calibrated_resolver
    from torchfl.fidelity.sample import stem
    from torchfl.fidelity.run import score_tables
    from torchfl.planner.errors import ChoiceError
    from torchfl.planner.target import resolve_target
    from torchfl.registry import NotFound

    def resolve(name):
        try:
            return resolve_target(name, registry)
        except (NotFound, ChoiceError) as exc:      # the row's chip is not in the registry
            raise LookupError(str(exc)) from None

    calibrations: dict = {}
    if calibration_tables:
        resolve, calibrations = calibrated_resolver(resolve, calibration_tables)
    total = sum(1 for t in loaded for r in t.rows if chip is None or r.chip == chip)
    with Progress(sys.stderr, "fidelity: planning rows", total=total, compiles=False) as p:
        def step(row):
            p.update(f"{row.chip}: {row.label()}")
            p.advance()
        result = score_tables(loaded, resolve, chip=chip, progress=step, worst=worst,
                              calibrated_on=frozenset(stem(t.path) for t in calibration_tables))
    result.calibrations = calibrations
    return result


def _print_calibration(calibrations) -> None:
    """Each calibrated chip's derived numbers: the file's value, the derived one, from where."""
    for name, (cal, hcd) in sorted(calibrations.items()):
        if not cal.numbers:
            continue
        click.echo(f"calibrated {name} on microbenchmarks (in memory; the registry's file is unchanged):")
        before = hcd.performance_numbers()
        for path, d in cal.numbers.items():
            old = before.get(path)
            was = "unset" if old is None else f"{old:g}"
            click.echo(f"  {path}: {was} -> {d.value:g}")
            click.echo(f"    {_name(d.row)}: {d.note}")
        for w in cal.warnings:
            click.echo(f"  warning: {w}")


def _swept(loaded, chip, registry, worst, cluster, resume):
    """``_score``'s result with each chip's rows as a unit of a recorded sweep (torchfl.cluster)."""
    from torchfl.cluster.fidelity import sweep_fidelity
    from torchfl.cluster.options import reported
    from torchfl.cluster.options import runner as make_runner
    from torchfl.registry import Registry

    state = {}
    runner = make_runner(cluster, 1, echo=lambda line: click.echo(line, err=True))
    with reported(lambda: state.get("sweep")):
        try:
            if cluster is not None:
                runner.connect()   # an unreachable cluster is refused before a sweep run is recorded
            return sweep_fidelity(loaded, chip, worst, registry=Registry(registry), runner=runner, resume=resume,
                                  echo=lambda line: click.echo(line, err=True), state=state)
        finally:
            runner.close()


def _record(result, registry) -> dict:
    from torchfl.fidelity.run import record
    from torchfl.registry import Registry

    with Registry(registry) as reg:
        return record(result, reg)


def _print(result, worst, runs) -> None:
    from rich.table import Table

    from torchfl.cli.render import console

    out = console()
    out.width = max(out.width, 120)      # a pipe or CI log: keep the table's columns whole
    from torchfl.fidelity.score import IN_SAMPLE, OUT_OF_SAMPLE

    group = "source" if result.by == "source" else "family"
    titles = {OUT_OF_SAMPLE: "Out of sample: predicted vs measured time per call (absolute relative error)",
              IN_SAMPLE: "In sample (a number of the chip was fitted on these rows: not a check)"}
    for sample in (OUT_OF_SAMPLE, IN_SAMPLE):
        scores = [s for s in result.scores if s.sample == sample]
        if not scores:
            continue
        t = Table(title=titles[sample])
        for col in ("chip", group, "rows", "mean", "median", "max", "bias", "rank corr.", "not planned"):
            t.add_column(col, justify="left" if col in ("chip", group) else "right")
        for s in scores:
            t.add_row(s.chip, s.family, str(s.rows), _pct(s.mean_abs_error), _pct(s.median_abs_error),
                      _pct(s.max_abs_error), "-" if s.mean_error is None else f"{s.mean_error:+.1%}",
                      "-" if s.spearman is None else f"{s.spearman:.3f}", str(s.unplanned) if s.unplanned else "")
        out.print(t)
    if group == "source":
        _print_sources(out, result)
    if worst:
        for s in result.scores:
            if s.family == "all" or not s.worst:
                continue
            out.print(f"worst {s.chip} {s.family}{' (in-sample)' if s.sample == IN_SAMPLE else ''}:")
            for p in s.worst:
                out.print(f"  {p.row.where}: {p.row.label()}: measured {p.row.seconds * 1e6:.1f} us, predicted "
                          f"{p.predicted_s * 1e6:.1f} us ({p.error:+.0%})", soft_wrap=True)
    unplanned = [p for p in result.predictions if p.predicted_s is None]
    for p in unplanned[:10]:
        out.print(f"not planned: {p.row.where}: {p.row.label()}: {p.reason}", soft_wrap=True)
    if len(unplanned) > 10:
        out.print(f"... and {len(unplanned) - 10} more rows not planned (--json lists them)")
    for table in result.tables:
        if table.harness_s:
            out.print(f"{table.name}: every prediction includes the table's harness overhead "
                      f"{table.harness_s * 1e6:g} us")
    held = sorted({_name(p.row.file) for p in result.predictions if result.is_in_sample(p)})
    if held:
        out.print(f"in-sample rows (a chip number was fitted or calibrated on them) from: {', '.join(held)}",
                  soft_wrap=True)
    for name, run in sorted(runs.items()):
        out.print(f"recorded fidelity run {run} for {name}")


def _name(path) -> str:
    from pathlib import Path

    return Path(path).name


def _print_sources(out, result) -> None:
    """Each scored source id with the tables that hold its rows and the header comment that
    names it (cut to the 100 columns of a pipe: the table's header has the whole reference)."""
    from rich.markup import escape

    comments = {t.path: t.comments for t in result.tables}
    seen: dict = {}
    for p in result.predictions:
        r = p.row
        seen.setdefault(r.source, {}).setdefault(_name(r.file), _reference(comments.get(r.file, ()), r.source))
    for source in sorted(seen):
        tables = seen[source]
        ref = next((c for c in tables.values() if c), "")
        line = f"source {source}: {', '.join(sorted(tables))}{': ' + ref if ref else ''}"
        out.print(escape(line if len(line) <= 100 else line[:97] + "..."), soft_wrap=True)


def _reference(comments, source: str) -> str:
    """The header comment that names ``source``, else the one that starts with "source", else ""."""
    for c in comments:
        if source and source in c:
            return c[:160]
    return next((c[:160] for c in comments if c.lower().startswith(("source", "sources"))), "")


def _host(tables, chip, as_json, record, worst, registry, threads, quick, out_dir) -> None:
    """``--host``: probe, time the host's rows, score them on the probe's HCD (fidelity/host.py)."""
    import tempfile

    from torchfl.cli.progress import Progress
    from torchfl.fidelity.host import run_host, score_host
    from torchfl.fidelity.probe import ProbeError
    from torchfl.registry import RegistryError

    if tables or chip:
        click.echo("error: --host times its own rows on this machine; leave --table and --chip out", err=True)
        sys.exit(2)
    with tempfile.TemporaryDirectory(prefix="torchfl-host-") as tmp:
        try:
            with Progress(sys.stderr, "fidelity --host", compiles=False) as p:
                def step(what, i, n):
                    p.update(what.split(":")[0], completed=i, total=n, detail=what)

                run = run_host(threads=threads, quick=quick, progress=step)
                p.update("scoring on the probe's HCD", completed=0, total=len(run.rows), detail="")
                res = score_host(run, out_dir or tmp, registry=registry, record=record,
                                 progress=lambda row: p.advance(),
                                 command="torchfl fidelity --host" + (" --quick" if quick else ""))
        except ProbeError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except (RegistryError, LookupError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
    s = res.models_summary
    if as_json:
        out = res.result.as_dict()
        out.update(recorded_runs=res.runs, host=dict(models=s, hcd=res.hcd_path if out_dir else None,
                                                     tables=res.tables if out_dir else None))
        click.echo(json.dumps(out, indent=2, sort_keys=True))
        return
    _print(res.result, worst, res.runs)
    med = "-" if s["median_abs_error"] is None else f"{s['median_abs_error']:.1%}"
    what = "quick stand-ins of ResNet-50 b1 and a BERT layer" if quick else "ResNet-50 b1 and a BERT-large layer s128"
    click.echo(f"host: the ops of {what} ({s['rows']} distinct calls planned, {s['unplanned']} not): median abs. "
               f"error {med}, {s['within_20pct']} within 20%")
    if out_dir:
        click.echo(f"kept: {res.hcd_path}, {res.tables['models']}, {res.tables['plain']}")
