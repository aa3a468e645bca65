"""The host as a real chip: time torch's own eager ops here, as rows of a fidelity table.

Two kinds of rows, in the fidelity CSV format (docs/HELPERS.md: ``chip,op,shapes,dtype,args,
seconds,source``; ``op`` the ATen overload, ``args`` its non-tensor arguments by schema name,
an optional tensor left out when no tensor follows it, ``null`` in ``args`` when one does):

- **model rows** (:func:`model_rows`): ResNet-50 b1 and a BERT-large layer at s128 (the
  ``resnet50_b1`` / ``bert_layer_s128`` cases of tools/bench_e2e.py, from planner/zoo.py) are
  captured on the planner's own path (``planner.capture.capture_module``), run once through
  ``torch.fx.Interpreter`` to get every node's real input values (valid indices, positive
  variances), and each op node is then timed alone on those values. Identical calls (the
  repeated blocks) are timed once; ``OpRow.count`` says how many nodes share a row.
  Left out, with the reason kept in ``skipped``: nodes that read no user input (the planner
  folds them: computed once, not per call) and non-ATen nodes (``getitem``).
- **plain rows** (:func:`plain_rows`): GEMMs, convolutions, softmax, layer norm and
  elementwise ops over a spread of sizes, on random inputs.

Each row is timed warm (a call before the samples; inputs stay wherever the previous call left
them, as in a model run) with the probe's :class:`~torchfl.fidelity.probe.Timer`, on the probe's
thread count: the median of ``repeat`` samples of enough calls to last ``sample_s``.
"""
from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import dataclass, field

from torchfl.fidelity.hostcall import call_row, jsonable, tensor_kind
from torchfl.fidelity.probe import Timer
from torchfl.hcd.dtypes import short_dtype

__all__ = ["OpRow", "HostTable", "MODEL_CASES", "model_rows", "plain_rows", "call_row", "family_of",
           "write_csv", "read_csv"]

#: name -> (zoo model, options, what it is)
MODEL_CASES = {
    "resnet50_b1": ("resnet50", dict(batch=1, image=224), "ResNet-50, 1x3x224x224"),
    "bert_layer_s128": ("bert-large", dict(batch=1, seq_len=128, layers=1), "BERT-large, one layer, 1x128 tokens"),
}
#: small stand-ins for tests (same ops, seconds to capture)
QUICK_CASES = {
    "resnet50_b1": ("resnet18", dict(batch=1, image=32), "ResNet-18, 1x3x32x32 (quick: ResNet-50's ops)"),
    "bert_layer_s128": ("bert-base", dict(batch=1, seq_len=16, layers=1, hidden=64, num_heads=4),
                        "BERT, one layer, hidden 64, 1x16 tokens (quick)"),
}

SOURCE = "torch-eager-host"


@dataclass
class OpRow:
    """One timed call: ``op`` an ATen overload name, ``shapes`` its tensor inputs' shapes in
    schema order, ``args`` its other arguments by schema name, ``seconds`` the median of
    ``runs`` (per-call seconds each)."""

    op: str
    shapes: list
    dtype: str
    args: dict
    seconds: float = 0.0
    runs: tuple = ()
    count: int = 1
    cases: list = field(default_factory=list)
    nodes: list = field(default_factory=list)

    @property
    def key(self) -> tuple:
        return (self.op, tuple(tuple(s) for s in self.shapes), self.dtype, json.dumps(self.args, sort_keys=True))

    @property
    def family(self) -> str:
        return family_of(self.op)

    def csv_fields(self, chip: str, source: str = SOURCE) -> list:
        return [chip, self.op, ";".join("x".join(str(d) for d in s) for s in self.shapes), self.dtype,
                json.dumps(self.args, sort_keys=True) if self.args else "", f"{self.seconds:.6g}", source]


@dataclass
class HostTable:
    rows: list
    skipped: list = field(default_factory=list)     # (case, node, op, why)
    threads: int = 1
    timer: str = "wall"


_FAMILIES = (
    ("attention", ("scaled_dot_product",)),
    ("conv", ("convolution", "conv2d", "conv1d")),
    ("matmul", ("aten.mm.", "addmm", "bmm", "linear", "matmul", "_int_mm")),
    ("norm", ("batch_norm", "layer_norm", "group_norm")),
    ("softmax", ("softmax",)),
    ("pool", ("pool",)),
    ("reduce", ("aten.mean.", "aten.sum.", "amax")),
    ("embedding", ("embedding",)),
    ("layout", ("aten.view.", "permute", "expand", "clone", "unsqueeze", "slice", "reshape", "transpose",
                "aten.cat.", "contiguous", "_unsafe_view", "aten.t.")),
)


def family_of(op: str) -> str:
    """The op family a row is reported under (the kernel families' names where they match)."""
    for fam, keys in _FAMILIES:
        if any(k in op for k in keys):
            return fam
    return "elementwise"


def _time(fn, timer: Timer, sample_s: float, repeat: int) -> tuple:
    number = timer.calls_for(fn, sample_s, cap=10_000)
    return tuple(timer.runs(fn, number=number, repeat=repeat, warmup=1))


# -- model rows -------------------------------------------------------------------------------

def _node_row(node, env):
    """(OpRow without times, (fn args, kwargs)) for an FX node over the interpreter's values."""
    import torch

    ovl = node.target
    schema = ovl._schema
    bound = {}
    for a, v in zip(schema.arguments, node.args):
        bound[a.name] = v
    bound.update(node.kwargs)
    shapes, args, dtypes = [], {}, []

    def real(v):
        if isinstance(v, torch.fx.Node):
            return env[v.name]
        if isinstance(v, (list, tuple)):
            return type(v)(real(x) for x in v)
        return v

    present = [a.name for a in schema.arguments if tensor_kind(a.type) and a.name in bound
               and bound[a.name] is not None]
    last_tensor = max((i for i, a in enumerate(schema.arguments) if a.name in present), default=-1)
    for i, a in enumerate(schema.arguments):
        kind = tensor_kind(a.type)
        if kind and (a.name not in bound or bound[a.name] is None):
            if i < last_tensor:      # an absent optional tensor before a present one: say so (null)
                args[a.name] = None
            continue                 # trailing absent optional tensors: left out, as the format reads them
        if a.name not in bound:
            continue
        v = real(bound[a.name])
        if kind == "one" and isinstance(v, torch.Tensor):
            shapes.append(list(v.shape))
            dtypes.append(v.dtype)
        elif kind == "list" and isinstance(v, (list, tuple)):
            for t in v:
                shapes.append(list(t.shape))
                dtypes.append(t.dtype)
        else:
            args[a.name] = jsonable(v)
    floats = [d for d in dtypes if d.is_floating_point]
    dtype = short_dtype((floats or dtypes or [torch.float32])[0])
    pos = [real(v) for v in node.args]
    kw = {k: real(v) for k, v in node.kwargs.items()}
    return OpRow(str(ovl), shapes, dtype, args), (pos, kw)


def _user_dependent(gm, inputs: set) -> set:
    """Names of the nodes whose value depends on a user input (the rest the planner folds)."""
    dep = set(inputs)
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method", "call_module") and any(
                a.name in dep for a in n.all_input_nodes):
            dep.add(n.name)
    return dep


def model_rows(cases=None, *, threads: int = 1, timer: str | None = None, quick: bool = False,
               progress=None, sample_s: float | None = None, repeat: int | None = None) -> HostTable:
    """Time every op node of the model cases (default: ``MODEL_CASES``; ``quick``: small
    stand-ins) on this host; ``progress(what, i, n)`` per row."""
    import torch

    from torchfl.planner.capture import capture_module
    from torchfl.planner.zoo import load_model

    table_cases = QUICK_CASES if quick else MODEL_CASES
    names = list(cases or table_cases)
    timer = timer or ("cpu" if threads == 1 else "wall")
    clock = Timer(timer, "cpu")
    sample_s = sample_s if sample_s is not None else (0.002 if quick else 0.02)
    repeat = repeat if repeat is not None else (3 if quick else 5)
    rows: dict = {}
    skipped = []
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name in names:
            if name not in table_cases:
                raise ValueError(f"unknown host case {name!r}; choose from {', '.join(table_cases)}")
            zoo, kw, _what = table_cases[name]
            model, inputs = load_model(zoo, **kw)
            if progress:
                progress(f"{name}: capture", 0, 1)
            captured = capture_module(model, inputs)
            gm = captured.graph_module
            args = []
            users = set()
            for pname, kind, target in captured.placeholders:
                if kind == "input":
                    args.append(inputs[target])
                    users.add(pname)
                else:
                    args.append(captured.tensors[pname])
            env = {}

            class Recorder(torch.fx.Interpreter):
                def run_node(self, n):
                    out = super().run_node(n)
                    env[n.name] = out
                    return out

            with torch.no_grad():
                Recorder(gm).run(*args)
            dep = _user_dependent(gm, users)
            todo = []
            for n in gm.graph.nodes:
                if n.op != "call_function":
                    continue
                if not isinstance(n.target, torch._ops.OpOverload):
                    skipped.append((name, n.name, str(n.target), "not an ATen op (a tuple element read)"))
                    continue
                if n.name not in dep:
                    skipped.append((name, n.name, str(n.target), "reads no user input: the plan folds it "
                                    "(computed once, not per call)"))
                    continue
                row, call = _node_row(n, env)
                have = rows.get(row.key)
                if have is not None:
                    have.count += 1
                    have.nodes.append(f"{name}:{n.name}")
                    if name not in have.cases:
                        have.cases.append(name)
                    continue
                row.cases, row.nodes = [name], [f"{name}:{n.name}"]
                rows[row.key] = row
                todo.append((row, n.target, call))
            with torch.no_grad():
                for i, (row, fn, (pos, kw2)) in enumerate(todo):
                    if progress:
                        progress(f"{name}: {row.op}", i, len(todo))
                    row.runs = _time(lambda: fn(*pos, **kw2), clock, sample_s, repeat)
                    row.seconds = float(statistics.median(row.runs))
            env.clear()
    finally:
        torch.set_num_threads(old)
    return HostTable(list(rows.values()), skipped, threads, timer)


# -- plain rows -------------------------------------------------------------------------------

def plain_specs(quick: bool = False) -> list:
    """(op, shapes, dtype, args) of the plain tables: a spread of sizes per family."""
    specs = []
    gemms = [(128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (128, 1024, 1024),
             (128, 4096, 1024), (128, 1024, 4096), (2048, 64, 64), (8192, 64, 64), (64, 4096, 64), (1, 1024, 1024),
             (16, 768, 768), (512, 768, 3072)]
    convs = [  # (N, C, H, W, K, R, stride, pad)
        (1, 3, 224, 224, 64, 7, 2, 3), (1, 64, 56, 56, 64, 3, 1, 1), (1, 64, 56, 56, 256, 1, 1, 0),
        (1, 256, 56, 56, 128, 1, 2, 0), (1, 128, 28, 28, 128, 3, 1, 1), (1, 256, 14, 14, 256, 3, 1, 1),
        (1, 512, 7, 7, 512, 3, 1, 1), (8, 64, 56, 56, 64, 3, 1, 1), (1, 1024, 14, 14, 256, 1, 1, 0)]
    rows2d = [(128, 128), (1024, 128), (128, 1024), (4096, 32), (1024, 1024), (4096, 1024), (12 * 128, 128),
              (8192, 4096)]
    elems = [4096, 65536, 1 << 20, 4 << 20, 16 << 20]
    if quick:
        gemms, convs, rows2d, elems = gemms[:2], convs[1:2], rows2d[:2], elems[:2]
    for m, k, n in gemms:
        specs.append(("aten.mm.default", [[m, k], [k, n]], "float32", {}))
    for nb, c, h, w, k, r, s, p in convs:
        specs.append(("aten.convolution.default", [[nb, c, h, w], [k, c, r, r]], "float32",
                      {"stride": [s, s], "padding": [p, p], "dilation": [1, 1], "transposed": False,
                       "output_padding": [0, 0], "groups": 1}))
    for r, c in rows2d:
        specs.append(("aten._softmax.default", [[r, c]], "float32", {"dim": -1, "half_to_float": False}))
        specs.append(("aten.layer_norm.default", [[r, c], [c], [c]], "float32",
                      {"normalized_shape": [c], "eps": 1e-5}))
    for n in elems:
        specs.append(("aten.add.Tensor", [[n], [n]], "float32", {}))
        specs.append(("aten.relu.default", [[n]], "float32", {}))
        specs.append(("aten.gelu.default", [[n]], "float32", {}))
        specs.append(("aten.mul.Tensor", [[n], [n]], "float32", {}))
    return specs


def plain_rows(*, threads: int = 1, timer: str | None = None, quick: bool = False, progress=None,
               sample_s: float | None = None, repeat: int | None = None) -> HostTable:
    import torch

    timer = timer or ("cpu" if threads == 1 else "wall")
    clock = Timer(timer, "cpu")
    sample_s = sample_s if sample_s is not None else (0.002 if quick else 0.02)
    repeat = repeat if repeat is not None else (3 if quick else 5)
    specs = plain_specs(quick)
    out = []
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            for i, (op, shapes, dtype, args) in enumerate(specs):
                if progress:
                    progress(f"plain: {op}", i, len(specs))
                fn, _ins = call_row(op, shapes, dtype, args)
                row = OpRow(op, shapes, dtype, args, cases=["plain"])
                row.runs = _time(fn, clock, sample_s, repeat)
                row.seconds = float(statistics.median(row.runs))
                out.append(row)
    finally:
        torch.set_num_threads(old)
    return HostTable(out, [], threads, timer)


# -- CSV ----------------------------------------------------------------------------------------

HEADER = ["chip", "op", "shapes", "dtype", "args", "seconds", "source"]


def write_csv(rows, chip: str, comments=(), source: str = SOURCE) -> str:
    """The rows as a fidelity table (``#`` comment lines first)."""
    buf = io.StringIO()
    for c in comments:
        buf.write(f"# {c}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(HEADER)
    for r in rows:
        w.writerow(r.csv_fields(chip, source))
    return buf.getvalue()


def read_csv(text: str) -> list:
    """OpRows back from :func:`write_csv`'s text (comment lines skipped)."""
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    out = []
    for rec in csv.DictReader(lines):
        shapes = [[int(d) for d in s.split("x") if d] for s in rec["shapes"].split(";")] if rec["shapes"] else []
        out.append(OpRow(rec["op"], shapes, rec["dtype"], json.loads(rec["args"]) if rec["args"] else {},
                         float(rec["seconds"])))
    return out


# -- the whole host run -----------------------------------------------------------------------

@dataclass
class HostRun:
    """A probe and the host tables timed right after it, same threads and timer."""

    probe: object            # torchfl.fidelity.probe.Probe
    models: HostTable
    plain: HostTable

    @property
    def rows(self) -> list:
        return self.models.rows + self.plain.rows

    def comments(self, command: str = "torchfl fidelity --host") -> list:
        import os
        import platform

        import torch

        p = self.probe
        load = ""
        try:
            load = f"; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs at the end"
        except OSError:
            pass
        cases = ", ".join(f"{n} ({w})" for n, (_z, _k, w) in (QUICK_CASES if p.quick else MODEL_CASES).items())
        return [f"torch's own eager ops timed on this host ({p.device_name}), {p.when}, by `{command}`",
                f"torch {torch.__version__}, Python {platform.python_version()}; {p.threads} thread(s), timer "
                f"{p.timer}{' (thread CPU time)' if p.timer == 'cpu' else ''}; median of the samples per row{load}",
                f"model rows: every op node of {cases}, captured as the planner does; repeated calls timed once",
                "plain rows: GEMMs, convolutions, softmax, layer norm and elementwise ops on random inputs",
                "source torch-eager-host: measured here, now; licence: as the project's"]


def run_host(*, threads: int = 1, timer: str | None = None, quick: bool = False, progress=None) -> HostRun:
    """Probe this host, then time its model and plain rows with the same threads and timer."""
    from torchfl.fidelity.probe import probe

    p = probe("cpu", threads=threads, timer=timer, quick=quick,
              progress=(lambda what, i, n: progress(f"probe: {what}", i, n)) if progress else None)
    models = model_rows(threads=p.threads, timer=p.timer, quick=quick, progress=progress)
    plain = plain_rows(threads=p.threads, timer=p.timer, quick=quick, progress=progress)
    return HostRun(p, models, plain)


# -- scoring (fidelity --host) -------------------------------------------------------------------

def probe_version(hcd_text: str) -> str:
    """A version that names the measured numbers: ``1.0.0+<8 hex of their hash>``. Two probes
    of one machine differ in their numbers, and a published (chip, version) never changes, so
    each probe is its own version; the same numbers re-imported are the same version."""
    import hashlib
    import re as _re

    body = _re.sub(r"(?m)^\s*#.*\n|^  version: .*\n", "", hcd_text)
    return "1.0.0+" + hashlib.sha256(body.encode()).hexdigest()[:8]


@dataclass
class HostScore:
    """What ``fidelity --host`` produced: the files written, the scorer's result (realchips'
    :class:`~torchfl.fidelity.run.FidelityResult`), the model rows' own summary and the runs
    recorded in the registry."""

    hcd_path: str
    tables: dict                  # "models" / "plain" -> CSV path
    result: object
    models_summary: dict
    runs: dict = field(default_factory=dict)


def _summary(preds) -> dict:
    done = [p for p in preds if p.predicted_s is not None]
    errs = sorted(abs(p.error) for p in done)
    out = {"rows": len(done), "unplanned": len(preds) - len(done),
           "median_abs_error": statistics.median(errs) if errs else None,
           "mean_abs_error": statistics.fmean(errs) if errs else None,
           "within_20pct": sum(e <= 0.2 for e in errs), "families": {}}
    fams: dict = {}
    for p in done:
        fams.setdefault(family_of(p.row.op), []).append(abs(p.error))
    for fam, es in sorted(fams.items()):
        out["families"][fam] = {"rows": len(es), "median_abs_error": statistics.median(es),
                                "mean_abs_error": statistics.fmean(es), "max_abs_error": max(es)}
    return out


def score_host(run: HostRun, out_dir, *, registry=None, record: bool = False, progress=None,
               command: str = "torchfl fidelity --host") -> HostScore:
    """Write the probe's HCD and the two host tables into ``out_dir``, plan every row on the
    probe's HCD (the bundled rule packs), score them; ``record``: import the HCD into the
    registry (its version names its numbers) and store the run as fidelity evidence."""
    from pathlib import Path

    from torchfl.fidelity.run import record as record_run, score_tables
    from torchfl.fidelity.tables import load_table
    from torchfl.planner.target import resolve_target

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = run.probe.hcd_text()
    version = probe_version(text)
    name = run.probe.chip_name()
    hcd_path = out / f"{name.lower()}.hcd"
    run.probe.write(hcd_path, version=version)
    comments = run.comments(command) + [f"chip {name} {version}: the probe's HCD, {hcd_path.name}"]
    paths = {}
    for kind, rows in (("models", run.models.rows), ("plain", run.plain.rows)):
        paths[kind] = out / f"{name.lower()}-{kind}.csv"
        paths[kind].write_text(write_csv(rows, name, comments), encoding="utf-8")
    tables = [load_table(paths["models"]), load_table(paths["plain"])]
    hcd = run.probe.hcd(version=version)
    if record:
        from torchfl.registry import Registry

        with Registry(registry) as reg:
            reg.import_files([str(hcd_path)])
    target = resolve_target(hcd, registry if record else None)
    result = score_tables(tables, lambda _chip: target, progress=progress)
    models = [p for p in result.predictions if p.row.file == str(paths["models"])]
    score = HostScore(str(hcd_path), {k: str(v) for k, v in paths.items()}, result, _summary(models))
    if record:
        from torchfl.registry import Registry

        with Registry(registry) as reg:
            score.runs = record_run(result, reg)
    return score
