"""``torchfl kernels info|warmup``: the compiled-kernel cache, and filling it ahead of time.

``info`` reads the cache directory (see :mod:`torchfl.kernels.jitcache`): where it is, why
there, its size, and per jitted function of this installation how many specialisations are
compiled (stale ones: written for an older source). ``warmup`` compiles the kernels the demo's
models use on the bundled chips (or the ones named) by running each (model, chip) job once,
in worker processes (Numba compiles on one core holding the GIL, so processes are the only
way to use more cores), the first chip's jobs first, with progress. Every kernel is cached the
moment it is compiled, so an interrupted warmup resumes where it stopped; jobs that completed
are recorded beside the cache with a hash of the kernel sources and skipped next time
(``--force`` reruns them).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import sys
import time
from pathlib import Path

import click

MARKER = "warmup.json"


@click.group()
def kernels() -> None:
    """The emulator's compiled kernels: where they are cached, compiling them ahead of time."""


def _size(n: int) -> str:
    from torchfl.kernels.units import fmt_bytes

    return fmt_bytes(n, compact=True)


def _wrapped(text: str, err: bool = False) -> None:
    """A sentence wrapped at spaces (100 columns in a pipe), continuation lines indented."""
    from torchfl.planner.texttable import paragraph

    click.echo("\n".join(paragraph(text, subsequent="    ")), err=err)


def _echo(text: str) -> None:
    """A ``  label:      value`` line wrapped at spaces under its value (100 columns in a pipe)."""
    from torchfl.planner.texttable import paragraph

    click.echo("\n".join(paragraph(text, subsequent=" " * 14)))


@kernels.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--functions/--families", default=False, show_default=True,
              help="One line per jitted function, or one per kernel family.")
def info(as_json, functions) -> None:
    """Where the kernel cache is, its size, and which kernels are compiled."""
    from torchfl.kernels import cacheinfo

    ci = cacheinfo.info()
    done = warmed_jobs(ci.path)
    if as_json:
        d = ci.to_dict()
        d["warmup_jobs_done"] = sorted(done)
        click.echo(json.dumps(d, indent=2, sort_keys=True))
        return
    new = f"go to {ci.writes_to}" if ci.writes_to else "are compiled in memory, for each process"
    if ci.ignored:      # issue 52: "read-only (its kernels are loaded from it)" of a plain file before
        click.echo(f"kernel cache: {ci.writes_to or 'none (kernels are compiled in memory, for each process)'}")
        if ci.writes_to:
            _echo("  chosen by:  the user cache directory, in place of $NUMBA_CACHE_DIR")
        _echo(f"  ignored:    {ci.ignored}: no kernels are loaded from it or saved in it (set $NUMBA_CACHE_DIR "
              "to a directory)")
    else:
        click.echo(f"kernel cache: {ci.path}")          # a path: one line, whole
        _echo(f"  chosen by:  {ci.source}")
    if ci.read_only:
        _echo(f"  read-only:  its kernels are loaded; new ones {new}")
    if ci.full:
        _echo("  full:       no space left on the file system where new kernels go: they are compiled in memory, "
              "for each process (free space there, or set $NUMBA_CACHE_DIR to a directory with room)")
    if not ci.exists and ci.ignored and not ci.writes_to:
        return
    if not ci.exists:
        _echo("  empty: nothing compiled yet (`torchfl kernels warmup` compiles the demo's kernels)")
        return
    fns = ci.functions
    stale = [f for f in fns if f.stale]
    _echo(f"  size:       {_size(ci.bytes)} ({_size(ci.bytes - ci.other_bytes)} for this installation"
          + (f", {_size(ci.other_bytes)} from {ci.other_dirs} other checkout dir(s)" if ci.other_dirs else "")
          + ")")
    _echo(f"  compiled:   {sum(f.specialisations for f in fns if not f.stale)} specialisations of "
          f"{len([f for f in fns if not f.stale])} jitted functions"
          + (f"; {len(stale)} stale (source changed since: recompiled on next use)" if stale else ""))
    broken = [(f, name) for f in fns for name in f.broken]
    if broken:
        _echo(f"  broken:     {len(broken)} unreadable file(s) (truncated or corrupted; discarded and "
              "compiled again on next use):")
        for f, name in broken:
            _echo(f"              {ci.path / _subdir_of(ci.path, name) / name}")
    if done:
        _echo(f"  warmed up:  {', '.join(sorted(done))}")
    if functions:
        rows = [(f"{'' if f.family == 'shared' else f.family + '/'}{f.module}.py:{f.line}", f.function, str(f.specialisations), _size(f.bytes),
                 "broken" if f.broken else "stale" if f.stale else "") for f in fns]
        head = ("source", "function", "specs", "size", "")
    else:
        fam: dict = {}
        for f in fns:
            if f.stale:
                continue
            n, s, b = fam.get(f.family, (0, 0, 0))
            fam[f.family] = (n + 1, s + f.specialisations, b + f.bytes)
        rows = [(k, str(n), str(s), _size(b)) for k, (n, s, b) in sorted(fam.items())]
        head = ("family", "functions", "specialisations", "size")
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    click.echo("")
    for r in [head] + rows:
        click.echo("  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in
                                    enumerate(zip(r, widths))).rstrip())


def _subdir_of(cache: Path, name: str) -> str:
    """The cache sub-directory holding file ``name`` (one per kernel source folder)."""
    found = next(cache.glob(f"*/{name}"), None)
    return found.parent.name if found is not None else ""


# ---------------------------------------------------------------------------- warmup

def _sources_hash() -> str:
    """A hash of the kernel sources: a recorded job is done only for the kernels it compiled."""
    import torchfl.kernels as k

    root = Path(k.__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def warmed_jobs(cache: Path) -> set:
    """The warmup jobs done for the kernel sources of this installation."""
    try:
        data = json.loads((cache / MARKER).read_text())
    except (OSError, ValueError):
        return set()
    src = _sources_hash()
    return {job for job, rec in data.items() if isinstance(rec, dict) and rec.get("sources") == src}


def _record(cache: Path, job: str, seconds: float) -> None:
    path = cache / MARKER
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[job] = {"sources": _sources_hash(), "seconds": round(seconds, 1),
                 "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


def job_name(model: str, chip: str, quick: bool) -> str:
    return f"{model}{'-quick' if quick else ''}@{chip}"


def _workloads(models, quick):
    from torchfl.cli import workloads

    if not models:
        return workloads.models(quick)
    return tuple(workloads.zoo_model(m) for m in models)


def _worker(jobs, events, registry, quick, models=(), parent=None) -> None:
    """A worker process: run jobs until the ``None`` sentinel, report compiles and results.
    It ends with the warmup that started it (``parent``), however that ends: kill -9 left the
    workers compiling, and multiprocessing's resource tracker with them."""
    import warnings

    from torchfl.kernels.lifetime import die_with_parent

    die_with_parent(parent)
    os.environ.setdefault("TORCHDYNAMO_VERBOSE", "0")
    # the workers are the parallelism: a compile helper each oversubscribed 2 cores
    os.environ["TORCHFL_COMPILE_HELPERS"] = "0"
    warnings.filterwarnings("ignore")
    import torch

    from torchfl.cli import workloads
    from torchfl.kernels.compiling import subscribe

    pid = os.getpid()
    subscribe(lambda ev: events.put(("compile", pid, ev.kind, ev.label, ev.seconds)), display=True)
    factories = {key: factory for key, _title, factory in _workloads(models, quick)}
    while True:
        job = jobs.get()
        if job is None:
            return
        model, chip = job
        events.put(("start", pid, model, chip))
        t0 = time.perf_counter()
        try:
            module, inputs = factories[model]()
            compiled = workloads.compile_model(module, chip, registry)
            with torch.no_grad():
                compiled(*inputs)
            err = None
        except Exception as exc:  # noqa: BLE001 - a job's failure, any type: reported by the parent, the others go on
            err = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        torch._dynamo.reset()
        events.put(("done", pid, model, chip, time.perf_counter() - t0, err))


def _check_chips(chips, registry) -> None:
    """Every ``--chip`` is a chip of the registry, or one line (with near names) and exit 1."""
    from torchfl.registry import Registry, RegistryError

    try:
        reg = Registry(registry)
        for name in chips:
            reg.record(name)
    except RegistryError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@kernels.command()
@click.option("--chip", "chips", multiple=True, metavar="NAME",
              help="A chip to compile for (repeatable); default: the demo's, NPU-V2 and NPU-V3.")
@click.option("--jobs", "-j", "workers", type=click.IntRange(min=1), default=None,
              help="Worker processes (default: the CPU count, at most one per job).")
@click.option("--model", "models", multiple=True, metavar="NAME",
              help="A zoo model at its default size instead of the demo's (repeatable): mlp, resnet18, ...")
@click.option("--quick", is_flag=True, help="The demo's --quick input sizes.")
@click.option("--force", is_flag=True, help="Rerun jobs recorded as done.")
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
def warmup(chips, workers, models, quick, force, registry) -> None:
    """Compile the kernels the demo's models (ResNet-50, a BERT layer) use on the bundled chips
    into the kernel cache, in parallel processes, with progress; resumable."""
    from torchfl.cli import workloads
    from torchfl.kernels import jitcache
    from torchfl.kernels.cacheinfo import info as info_of

    cache = jitcache.configure()
    chips = chips or workloads.CHIPS
    # the first chip's jobs first: they compile; later chips mostly load what those cached
    from torchfl.planner.zoo import ZOO

    unknown = [m for m in models if m not in ZOO]
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}: choose from {', '.join(ZOO)}", param_hint="--model")
    _check_chips(chips, registry)   # before any worker starts torch: an unknown chip cost 15 s and a worker
    todo = [(model, chip) for chip in chips for model, _t, _f in _workloads(models, quick)]
    done = set() if force else warmed_jobs(cache)
    skipped = [j for j in todo if job_name(*j, quick) in done]
    todo = [j for j in todo if j not in skipped]
    click.echo(f"kernel cache: {cache}")          # a path: one line, whole
    if skipped:
        _wrapped(f"already warmed up (kernel sources unchanged): "
                 f"{', '.join(job_name(*j, quick) for j in skipped)}; --force reruns them")
    if not todo:
        return
    # all jobs queued at once: a worker done with its job takes the next chip's, which on 2
    # cores compiles what the first chip's slowest job still has ahead (some twice): 72 s for the
    # demo's cold warmup, against 82 s one chip at a time and 88 s with a compile helper per job
    n = min(workers or os.cpu_count() or 1, len(todo))
    t_start = time.perf_counter()
    failures = _run_jobs(todo, n, cache, registry, quick, models)
    click.echo(f"warmup finished in {time.perf_counter() - t_start:.1f} s; "
               f"cache {_size(info_of(read_index=False).bytes)} at {cache}")
    if failures:
        _wrapped("failed: " + "; ".join(failures), err=True)
        sys.exit(1)


def _run_jobs(todo, n, cache, registry, quick, models) -> list:
    """The warmup jobs in ``n`` spawned worker processes, with progress; returns the failures."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    jobs, events = ctx.Queue(), ctx.Queue()
    for j in todo:
        jobs.put(j)
    for _ in range(n):
        jobs.put(None)
    procs = [ctx.Process(target=_worker, args=(jobs, events, registry, quick, models, os.getpid()), daemon=True)
             for _ in range(n)]
    failures = []
    with progress_of(sys.stdout, len(todo), n) as p:
        for proc in procs:
            proc.start()
        try:
            _follow(p, events, procs, len(todo), cache, quick, failures)
        finally:
            for proc in procs:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.terminate()
    return failures


def progress_of(stream, jobs: int, workers: int, **options):
    """The warmup's progress on ``stream``: in a pipe its lines wrapped at spaces to 100 columns,
    as the demo's (a heartbeat naming every running job, or a job's error, ran past 100)."""
    from torchfl.cli.progress import Progress
    from torchfl.cli.render import PipeLines

    return Progress(PipeLines(stream), f"warmup: {jobs} job(s) in {workers} process(es)", total=jobs,
                    compiles=False, **options)


def _follow(p, events, procs, total, cache, quick, failures) -> None:
    """Show the workers' events until ``total`` jobs finished (or every worker died)."""
    from torchfl.kernels.compiling import CompileEvent

    finished, running = 0, []
    while finished < total:
        try:
            ev = events.get(timeout=1.0)
        except queue.Empty:   # check the workers are alive
            if not any(proc.is_alive() for proc in procs):
                failures.append("a worker process died (see above)")
                break
            continue
        if ev[0] == "compile":
            _pid, kind, label, secs = ev[1:]
            p.compile_event(CompileEvent(kind, label, label, secs))
        elif ev[0] == "start":
            name = job_name(ev[2], ev[3], quick)
            running.append(name)
            p.print(f"started: {name} (process {ev[1]})")
            p.update(detail="running " + ", ".join(running))
        else:
            _pid, model, chip, secs, err = ev[1:]
            finished += 1
            name = job_name(model, chip, quick)
            running.remove(name)
            p.update(detail="running " + ", ".join(running) if running else "")
            if err:
                failures.append(f"{name}: {err}")
                p.print(f"failed: {name} after {secs:.1f} s: {err}")
            else:
                _record(cache, name, secs)
                p.print(f"done: {name} in {secs:.1f} s")
            p.advance()
