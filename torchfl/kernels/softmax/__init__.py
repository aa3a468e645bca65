"""Softmax family: softmax, log_softmax (over ``dim``) and their backward.

Tiling (``plan_softmax``): a unit is one row along ``dim``. Whole rows stream in
double-buffered tiles (``stream_plan``): reads = inputs once, writes = output once.
When one row does not fit twice in the cache, ``row_split``: the row is walked in
chunks twice (pass 1 running max and sum, pass 2 normalise and store), so reads double.
A chip whose rows are spread over many cores states how long a row one core keeps across
the passes (HCD 1.1 ``execution.row_resident_elements``, ``chip.row_elements``): a longer
row is ``row_split`` in chunks of at most that many elements however big the shared cache
is, since the core that reduces it cannot hold it (measured: PyTorch's softmax on an A100
or MI210 takes about twice the one-pass time for rows over 1024 elements).
"""
from __future__ import annotations

from ..dtypes import FLOATS, ITEMSIZE
from ..errors import KernelError
from ..spec import KernelSpec, TensorMeta
from dataclasses import replace

from ..tiling import TileConfig, Traffic, make_plan, stream_plan

COST = {"softmax": 5, "log_softmax": 5, "softmax_backward": 4, "log_softmax_backward": 4}


def ins(p):
    return ("grad", "out") if p.kernel.endswith("backward") else ("x",)


def _dim(p):
    shape = p.shapes[ins(p)[0]]
    r = max(len(shape), 1)
    d = p.attrs["dim"]
    if not -r <= d < r:
        raise KernelError(f"{p.kernel}: dim {d} out of range for shape {list(shape)}")
    return d % r


def _check(p):
    names = ins(p)
    if len(names) == 2 and p.shapes["grad"] != p.shapes["out"]:
        raise KernelError(f"{p.kernel}: grad {list(p.shapes['grad'])} and out {list(p.shapes['out'])} differ")
    _dim(p)


def _meta(p):
    n = ins(p)[0]
    return [TensorMeta(p.shapes[n], p.dtype, p.layouts.get(n))]


def plan_softmax(p, chip):
    """THE tiling function of the softmax family (see the module docstring). On a chip with
    a parallel grain the plan states its rows as ``parallel_units`` (one row per core)."""
    plan = _plan_softmax(p, chip)
    return with_rows(plan, plan_rows(p), chip)


def plan_rows(p):
    shape = p.shapes[ins(p)[0]]
    d = _dim(p)
    rows = 1
    for i, s in enumerate(shape):
        if i != d:
            rows *= s
    return rows


def with_rows(plan, rows, chip):
    """``plan`` with its rows stated as the units a many-core chip spreads one per core
    (``TileConfig.parallel_units``); unchanged on a chip without a parallel grain (1.0)."""
    if not getattr(chip, "concurrent_tiles", 0) or rows <= 0:
        return plan
    return replace(plan, config=replace(plan.config, parallel_units=int(rows)))


def _plan_softmax(p, chip):
    shape = p.shapes[ins(p)[0]]
    d = _dim(p)
    L = shape[d] if shape else 1
    rows = 1
    for i, s in enumerate(shape):
        if i != d:
            rows *= s
    es = ITEMSIZE[p.dtype]
    nin = len(ins(p))
    cost = COST[p.kernel]
    if L == 0 or rows == 0:
        return stream_plan(p.kernel, p.key, 0, 0, 0, 0, chip, unit_name="rows")
    limit = getattr(chip, "row_elements", 0)
    if not limit or L <= limit:
        plan = stream_plan(p.kernel, p.key, rows, nin * L * es, L * es, cost * L, chip, unit_name="rows")
        if plan is not None:
            return plan
    # row_split: chunks of C elements, double-buffered (inputs and output)
    C = chip.cache_bytes // (2 * (nin + 1) * es)
    if C < 1:
        raise KernelError(f"{p.kernel}: not one element fits the {chip.cache_bytes} B cache of {chip.name}")
    why = f"a row of {L} does not fit twice"
    if limit and L > limit:
        C = min(C, limit)
        why = f"a row of {L} exceeds the {limit} elements one core keeps (row_resident_elements)"
    full, rest = divmod(L, C)
    groups = []
    for c, cnt in ((C, full), (rest, 1 if rest else 0)):
        if cnt:
            # per chunk: pass-1 read + pass-2 read and write
            groups.append((cnt * rows, Traffic(2 * nin * c * es, c * es, cost * c)))
    cfg = TileConfig("row_split", (("rows", 1), ("chunk", C)), True,
                     f"{why}: two passes over chunks of {C}")
    return make_plan(p.kernel, p.key, cfg, groups, 2 * (nin + 1) * C * es)


def _spec(name, inputs, doc, fuses):
    return KernelSpec(name=name, family="softmax", inputs=inputs, attrs={"dim": -1}, dtypes=FLOATS,
                      layouts="any", fuses=(), doc=doc, check=_check, meta=_meta, tiler=plan_softmax,
                      impl="run_softmax")


KERNELS = [
    _spec("softmax", ("x",), "exp(x - max) / sum over dim", ("aten._softmax",)),
    _spec("log_softmax", ("x",), "x - max - log(sum exp) over dim", ("aten._log_softmax",)),
    _spec("softmax_backward", ("grad", "out"), "out * (grad - sum(grad * out)) over dim",
          ("aten._softmax_backward_data",)),
    _spec("log_softmax_backward", ("grad", "out"), "grad - exp(out) * sum(grad) over dim",
          ("aten._log_softmax_backward_data",)),
]
