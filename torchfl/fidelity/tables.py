"""Tables of measured op times (CSV) that the planner's predictions are scored against.

Format (docs/HELPERS.md, "Fidelity tables"): ``#`` comment lines (the full reference and
licence) above one header row ``chip,op,shapes,dtype,args,seconds,source``, then one row per
measured call:

- ``chip``: the chip name its HCD uses (``A100-SXM4-80GB``);
- ``op``: an ATen overload (``aten.mm.default``) or an alias (:data:`ALIASES`: ``matmul``,
  ``softmax``, ``layer_norm``, ``gelu``, ``conv2d``, ``bmm``, ``linear``; the microbenchmark rows' ``copy``
  and ``launch``), which also names the default arguments;
  or a language model's serving step (:data:`LM_KINDS`: ``prefill``, ``decode``, ``generate``;
  ``shapes`` one ``BATCHxTOKENS``, ``args`` the model: :mod:`torchfl.fidelity.lm`);
- ``shapes``: the input tensors' shapes, ``;`` between tensors, ``x`` between dims
  (``8192x64;64x64``; an empty piece is a 0-d tensor);
- ``dtype``: the inputs' dtype (``float16`` or ``torch.float16``);
- ``args``: a JSON object of the overload's non-tensor arguments by schema name, or empty;
- ``seconds``: the measured time of one call (> 0);
- ``source``: a short id of where the number comes from.

Three header comments are read as directives (each on its own ``#`` line, a reason after it):

- ``# harness_overhead_us: 33 <why>``: what the table's timing harness adds to every call
  beyond one eager launch (a ``torch.compile``'d call's guards and launcher, say), in
  microseconds, measured apart from the rows; the scorer adds it to every prediction of
  the table and reports it;
- ``# calibrates: <what>``: a number of a bundled HCD was derived from a row of this table,
  so its score is in-sample; reports mark the table;
- ``# timing: call | kernel``: how a row was timed. ``call`` (the default of a scored table):
  one eager call from the host or between events around it, so a row holds each kernel's launch,
  and the prediction does too. ``kernel``: the kernels' device time alone (a profiler's per-kernel
  durations, or many calls back to back where the launches overlap the previous kernel), so the
  prediction leaves every launch out. Microbenchmark tables read the same line
  (:func:`torchfl.fidelity.calibrate.timing_of`, default ``kernel`` there).

Every problem of a file is reported at once, each as ``file:line: message`` (:class:`TableError`).
No torch here: the overload's existence and arguments are checked where the row's graph is
built (:mod:`torchfl.fidelity.oneop`), which names the row's line too.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from torchfl.hcd.dtypes import ITEMSIZE, short_dtype

__all__ = ["ALIASES", "COLUMNS", "Row", "Table", "TableError", "bundled_tables", "family_of", "load_table",
           "load_tables", "make_row"]

COLUMNS = ("chip", "op", "shapes", "dtype", "args", "seconds", "source")
#: alias -> (ATen overload, default non-tensor arguments by schema name)
ALIASES = {
    "matmul": ("aten.mm.default", {}),
    "softmax": ("aten._softmax.default", {"dim": -1, "half_to_float": False}),
    "layer_norm": ("aten.layer_norm.default", {}),      # normalized_shape: the last dim (oneop)
    "gelu": ("aten.gelu.default", {}),
    "conv2d": ("aten.conv2d.default", {}),
    "bmm": ("aten.bmm.default", {}),
    "linear": ("aten.linear.default", {}),             # input, weight (out x in), bias (out)
    "copy": ("aten.clone.default", {}),                 # a copy-bandwidth microbenchmark row: read + write
    "launch": ("aten.add.Tensor", {}),                  # a launch-latency row: a one-element add, shapes 1;1
}
#: language-model rows (torchfl.fidelity.lm): op is the kind, args name the model
LM_KINDS = ("prefill", "decode", "generate")
#: op family of an ATen op's base name (scores are kept per chip and family)
_FAMILIES = {
    "mm": "matmul", "addmm": "matmul", "bmm": "matmul", "matmul": "matmul", "linear": "matmul",
    "_softmax": "softmax", "softmax": "softmax", "_log_softmax": "softmax", "log_softmax": "softmax",
    "layer_norm": "layer_norm", "native_layer_norm": "layer_norm",
    "gelu": "gelu",
    "conv2d": "conv2d", "convolution": "conv2d",
}
OVERLOAD = re.compile(r"^aten\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")
MAX_BYTES = 8 << 20
MAX_ROWS = 100_000
MAX_DIM = 1 << 40
MAX_NUMEL = 1 << 48          # elements of one tensor (a 512 TiB float16 tensor): 2**40 x 2**40 overflowed torch
MAX_ARGS_DEPTH = 8           # nesting of a row's args JSON: an overload's arguments are a level or two deep
#: a measured time of one call: at least a nanosecond (no chip runs a call in less than a clock
#: cycle; 5e-324 made every error inf%), at most a day (a language model's whole generation fits)
MIN_SECONDS, MAX_SECONDS = 1e-9, 86_400.0


class TableError(ValueError):
    """A table that cannot be used; ``problems`` lists every ``file:line: message``."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class Row:
    """One measured call. ``op`` is the resolved ATen overload, ``alias`` the table's short
    name (or None); ``args`` are the alias's defaults updated by the row's own."""

    chip: str
    op: str
    shapes: tuple
    dtype: str
    args: dict = field(default_factory=dict, hash=False, compare=True)
    seconds: float = 0.0
    source: str = ""
    alias: str | None = None
    file: str = "<row>"
    line: int = 0
    harness_s: float = 0.0      # the table's harness_overhead_us, in seconds
    timing: str = "call"        # the table's ``# timing:``: "kernel" leaves each launch out of the prediction

    @property
    def family(self) -> str:
        return family_of(self.alias or self.op)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def key(self) -> tuple:
        """What determines the graph (chip and time aside): rows with equal keys share one capture."""
        return (self.op, self.shapes, self.dtype, json.dumps(self.args, sort_keys=True))

    def label(self) -> str:
        """``softmax 4096x32 float16`` (how reports name a row)."""
        shapes = ";".join("x".join(map(str, s)) for s in self.shapes)
        extra = "" if not self.args or self.alias in ALIASES and self.args == ALIASES[self.alias][1] else \
            " " + json.dumps(self.args, sort_keys=True)
        return f"{self.alias or self.op} {shapes} {self.dtype}{extra}"

    def as_dict(self) -> dict:
        return dict(chip=self.chip, op=self.op, alias=self.alias, shapes=[list(s) for s in self.shapes],
                    dtype=self.dtype, args=self.args, seconds=self.seconds, source=self.source,
                    where=self.where)


@dataclass(frozen=True)
class Table:
    """A loaded table: its rows and its header comments (the reference and licence)."""

    path: str
    rows: tuple
    comments: tuple = ()
    harness_s: float = 0.0
    calibrates: tuple = ()       # what the ``# calibrates:`` lines say
    timing: str | None = None    # the ``# timing:`` line's word, None where absent or not one of TIMINGS

    @property
    def in_sample(self) -> bool:
        return bool(self.calibrates)

    @property
    def name(self) -> str:
        return Path(self.path).name


def family_of(op: str) -> str:
    """``matmul`` for ``aten.mm.default`` or the alias ``matmul``; the base name otherwise."""
    if op in ALIASES or op in LM_KINDS:
        return op
    base = op.split(".")[1] if op.count(".") >= 2 else op
    return _FAMILIES.get(base, base)


def bundled_tables() -> list[Path]:
    """The published tables shipped with torchfl (``measurements/*.csv``), sorted by name."""
    from torchfl.resources import bundled_path

    return sorted(bundled_path("measurements").glob("*.csv"))


def load_tables(paths) -> list[Table]:
    """Load several tables; one :class:`TableError` lists the problems of all of them."""
    tables, problems = [], []
    for path in paths:
        try:
            tables.append(load_table(path))
        except TableError as exc:
            problems.extend(exc.problems)
    if problems:
        raise TableError(problems)
    return tables


def load_table(path) -> Table:
    """Read one CSV table, or raise :class:`TableError` listing every problem with its line."""
    path = Path(path)
    name = str(path)
    try:
        if not path.is_file():
            raise TableError([f"{name}: not a file; give the path of a CSV table (measurements/*.csv)"])
        if path.stat().st_size > MAX_BYTES:
            raise TableError([f"{name}: {path.stat().st_size:,} bytes, above the {MAX_BYTES:,}-byte limit of a "
                              "table; split it"])
        raw = path.read_bytes()
    except OSError as exc:
        raise TableError([f"{name}: cannot read it ({exc.strerror or exc}); check the path and permissions"])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise TableError([f"{name}:{line}: not UTF-8 text (byte {exc.start}); save the table as UTF-8"])
    return parse_table(text, name)


#: the words of a ``# timing:`` line
TIMINGS = ("kernel", "call")


def stated_timing(comments) -> tuple[str | None, str | None]:
    """``(word, comment)`` of the first ``# timing:`` comment: the word when it is one of
    :data:`TIMINGS`, else None with the comment; (None, None) if there is none."""
    for c in comments:
        if c.lower().startswith("timing:"):
            words = c.split(":", 1)[1].split()
            return (words[0] if words and words[0] in TIMINGS else None), c
    return None, None


def _directives(lines: list, name: str) -> tuple:
    """The leading ``#`` comments: ``(comments, index of the first other line, harness seconds,
    calibrates, problems)`` (the directives of the module docstring)."""
    comments, start = [], 0
    harness, calibrates, problems = 0.0, [], []
    while start < len(lines) and (lines[start].lstrip().startswith("#") or not lines[start].strip()):
        if lines[start].lstrip().startswith("#"):
            comment = lines[start].strip().lstrip("#").strip()
            comments.append(comment)
            if comment.startswith("harness_overhead_us:"):
                value = comment.split(":", 1)[1].split()
                try:
                    harness = float(value[0]) * 1e-6 if value else -1.0
                except ValueError:
                    harness = -1.0
                if not (math.isfinite(harness) and 0 <= harness <= 1.0):
                    problems.append(f"{name}:{start + 1}: harness_overhead_us: write a number of microseconds >= 0 "
                                    "and a reason, e.g. '# harness_overhead_us: 33 torch.compile call'")
                    harness = 0.0
            elif comment.startswith("calibrates:"):
                calibrates.append(comment.split(":", 1)[1].strip())
            elif comment.lower().startswith("timing:") and stated_timing([comment])[0] is None:
                problems.append(f"{name}:{start + 1}: timing: write '# timing: call' (one call timed from the host "
                                "or between events around it: the launch is in each row) or '# timing: kernel' "
                                "(the kernels' device time alone), then a reason")
        start += 1
    return comments, start, harness, calibrates, problems


def parse_table(text: str, name: str = "<table>") -> Table:
    """Parse table text (see the module docstring); :class:`TableError` on any problem."""
    lines = text.splitlines(keepends=True)
    comments, start, harness, calibrates, problems = _directives(lines, name)
    timing, _comment = stated_timing(comments)
    if problems:
        raise TableError(problems)
    if start == len(lines):
        raise TableError([f"{name}:{start or 1}: no header row; the first line that is not a # comment must be "
                          f"{','.join(COLUMNS)}"])
    reader = csv.reader(io.StringIO("".join(lines[start:])), strict=True)
    rows: list[Row] = []
    try:
        header = [h.strip() for h in next(reader)]
    except csv.Error as exc:
        raise TableError([f"{name}:{start + 1}: unreadable header row ({exc})"])
    missing = [c for c in COLUMNS if c not in header]
    unknown = [h for h in header if h not in COLUMNS]
    if missing or unknown or len(set(header)) != len(header):
        what = []
        if missing:
            what.append(f"missing {', '.join(missing)}")
        if unknown:
            what.append(f"unknown {', '.join(unknown)}")
        if len(set(header)) != len(header):
            what.append("a column is named twice")
        raise TableError([f"{name}:{start + 1}: header row: {'; '.join(what)}; the header is "
                          f"{','.join(COLUMNS)} (any order)"])
    index = {c: header.index(c) for c in COLUMNS}
    previous_end = 1
    try:
        for record in reader:
            line = start + previous_end + 1     # the record's first line (csv counts its last)
            previous_end = reader.line_num
            if not record or all(not c.strip() for c in record):
                continue
            if record[0].lstrip().startswith("#"):
                continue
            if len(rows) >= MAX_ROWS:
                problems.append(f"{name}:{line}: more than {MAX_ROWS:,} rows; split the table")
                break
            if len(record) != len(header):
                problems.append(f"{name}:{line}: {len(record)} fields, the header has {len(header)}; quote a "
                                "field that holds a comma (args: \"{\"\"dim\"\": -1}\")")
                continue
            values = {c: record[i].strip() for c, i in index.items()}
            try:
                row = make_row(**values, file=name, line=line)
                if harness or timing == "kernel":
                    row = replace(row, harness_s=harness, timing=timing or "call")
                rows.append(row)
            except TableError as exc:
                problems.extend(exc.problems)
    except csv.Error as exc:
        problems.append(f"{name}:{start + reader.line_num}: {exc}; check the quoting")
    if problems:
        raise TableError(problems)
    if not rows:
        raise TableError([f"{name}:{start + 1}: the table has a header but no rows"])
    return Table(name, tuple(rows), tuple(comments), harness, tuple(calibrates), timing)


def make_row(chip, op, shapes, dtype, args, seconds, source, *, file="<row>", line=0) -> Row:
    """One row from its seven fields (strings as in a CSV, or already typed: ``shapes`` a list
    of shapes, ``args`` a dict, ``seconds`` a float); :class:`TableError` names each bad field."""
    where = f"{file}:{line}"
    problems = []

    def bad(column, message):
        problems.append(f"{where}: {column}: {message}")

    chip = str(chip).strip()
    if not chip:
        bad("chip", "empty; write the chip's name as its HCD gives it (chip.name, e.g. A100-SXM4-80GB)")
    op = str(op).strip()
    alias = None
    defaults: dict = {}
    if op in ALIASES:
        alias = op
        op, defaults = ALIASES[alias]
    elif op in LM_KINDS:
        alias = op
    elif not OVERLOAD.match(op):
        bad("op", f"{op!r} is neither an ATen overload (aten.NAME.OVERLOAD, e.g. aten.mm.default) nor an alias "
                  f"({', '.join(ALIASES)})")
    parsed_shapes = _shapes(shapes, bad)
    dt = short_dtype(str(dtype).strip())
    if dt not in ITEMSIZE:
        bad("dtype", f"{dtype!r} is not a dtype; write one of {', '.join(sorted(ITEMSIZE))}")
    parsed_args = _args(args, bad)
    try:
        secs = float(seconds)
        if not math.isfinite(secs) or secs <= 0:
            raise ValueError
    except (TypeError, ValueError):
        bad("seconds", f"{seconds!r} is not a positive number of seconds (one call's measured time, e.g. 2.96e-05)")
        secs = 0.0
    else:
        if not MIN_SECONDS <= secs <= MAX_SECONDS:
            bad("seconds", f"{seconds!r} is outside the plausible time of one call ({MIN_SECONDS:g} to "
                           f"{MAX_SECONDS:g} s); check the unit (seconds, e.g. 2.96e-05 for 29.6 us)")
    source = str(source).strip()
    if not source:
        bad("source", "empty; give a short id of where the number comes from (the header comments give the full "
                      "reference)")
    if problems:
        raise TableError(problems)
    return Row(chip, op, parsed_shapes, dt, {**defaults, **parsed_args}, secs, source, alias, file, line)


def _shapes(value, bad) -> tuple:
    if isinstance(value, (list, tuple)):
        pieces = [list(s) for s in value]
    else:
        text = str(value).strip()
        if not text:
            bad("shapes", "empty; give each input tensor's shape, ';' between tensors, 'x' between dims "
                          "(8192x64;64x64)")
            return ()
        pieces = []
        for piece in text.split(";"):
            piece = piece.strip()
            dims = piece.split("x") if piece else []
            if not all(re.fullmatch(r"\d{1,13}", d.strip()) for d in dims):
                bad("shapes", f"{piece!r} is not a shape; write dims as integers joined by 'x' (4096x1024)")
                return ()
            pieces.append([int(d) for d in dims])
    out = []
    for dims in pieces:
        if len(dims) > 16 or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM
                                     for d in dims):
            bad("shapes", f"{dims} is not a plausible shape (at most 16 dims, each 0 to 2**40)")
            return ()
        if math.prod(dims) > MAX_NUMEL:
            bad("shapes", f"{'x'.join(map(str, dims))} has {math.prod(dims):.3g} elements, above the 2**48 that one "
                          "tensor may have here; check the shape")
            return ()
        out.append(tuple(dims))
    return tuple(out)


def _args(value, bad) -> dict:
    if isinstance(value, dict):
        return dict(value)
    text = str(value).strip()
    if not text:
        return {}
    if _depth(text) > MAX_ARGS_DEPTH:
        bad("args", f"JSON nested deeper than {MAX_ARGS_DEPTH} levels; an overload's arguments are a flat object "
                    "such as {\"dim\": -1} or {\"stride\": [2, 2]}")
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        bad("args", f"not JSON ({exc.msg} at character {exc.pos + 1}); write an object such as {{\"dim\": -1}}, "
                    "quoted for CSV")
        return {}
    if not isinstance(parsed, dict):
        bad("args", f"a JSON {type(parsed).__name__}, not an object; write the arguments by their schema names, "
                    "e.g. {\"dim\": -1}")
        return {}
    return parsed


def _depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, outside strings (read before parsing:
    the parser recurses, and 10,000 levels raised RecursionError)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest
