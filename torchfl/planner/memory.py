"""The plan's device-memory plan: the buffers live at each step, sized and aligned as the
executor's allocator accounts them, and the peak.

Why here, in the planner: a plan that cannot fit the chip's ``off_chip_memory.size_gb``
must be refused before anything runs, and the what-if questions (the largest batch that
fits, a chip comparison) are answered by planning, not by running. So buffer lifetimes are
decided once, here, as part of the plan's contract; the executor (``runtime/executor.py``)
frees exactly what this plan frees, after the step it names, and explain analyze sets the
allocator's measured peak beside :attr:`MemoryPlan.peak_bytes`.

The model of an execution (the executor's, step by step):

* before step 0 every lifted parameter, buffer and constant is uploaded in its graph dtype
  and stays resident (a later call reuses it); then each user input that a step or the
  output reads is uploaded in its plan layout and dtype;
* a chip step allocates one buffer per kernel output (``KernelSpec.output_meta`` of its
  problem: what ``RunContext.outputs`` allocates); a metadata reshape (row-major input)
  allocates nothing and shares its input's buffer (one *alias group*); a host step
  (fallback, fold) allocates one buffer per named tensor output;
* after a step, outputs the plan does not name are freed at once (*scratch*), then every
  group whose last reader or maker that step was; groups that hold a static value (weights,
  their casts and layout copies, folded constants) stay resident across calls when a
  per-call step or the output reads them (a float32 parameter read only by its static cast
  to float16 is freed after the cast: the chip keeps one copy, in the plan's dtype), and
  groups that hold a graph output are freed after the download;
* a buffer costs its bytes rounded up to whole alignment granules
  (:func:`torchfl.kernels.memory.accounted_bytes`, the allocator's own rule). Kernels keep
  no device workspace: their tiles live in the on-chip cache, which is not off-chip memory.

``static_inputs`` (positions of user inputs that are weights the runtime caches, as
Dynamo's parameters are) makes those inputs resident too; the planner's own plan has none.
"""

from __future__ import annotations

from collections import defaultdict

from torchfl.kernels.dtypes import itemsize, stored  # cheap (no numba, no torch), called per step
from torchfl.kernels.units import fmt_bytes
from torchfl.planner.buffers import KINDS, WHY, Buffer, MemoryPlan
from torchfl.planner.errors import HardConstraintError
from torchfl.planner.records import HOST_STEPS, identity_layout

__all__ = ["KINDS", "WHY", "Buffer", "MemoryPlan", "plan_memory", "check_memory", "check_weights",
           "MemoryLimitError", "kv_cache_values", "kv_cache_table", "clear_cache"]


class MemoryLimitError(HardConstraintError):
    """The plan's peak device memory exceeds ``off_chip_memory.size_gb``; ``.memory`` holds
    the :class:`MemoryPlan` (its breakdown is still worth showing)."""

    def __init__(self, message: str, memory: "MemoryPlan", **kw):
        super().__init__(message, **kw)
        self.memory = memory


def _kernel_layout(layout: str | None, rank: int):
    return None if not layout or layout == identity_layout(rank) else layout


def _nbytes(shape, dtype: str) -> int:
    n = itemsize(dtype)
    for s in shape:
        n *= int(s)
    return n


_OUTPUT_BYTES: dict = {}


def clear_cache() -> None:
    """Forget the memoised kernel output sizes (a cold-planning benchmark starts from none)."""
    _OUTPUT_BYTES.clear()


def _kernel_outputs(step, values) -> list[int]:
    """Bytes of each buffer the step's kernel allocates (its output metadata for the
    problem its inputs make, as the executor binds it). Memoised per call signature
    (kernel, its bound inputs' shapes, dtypes and layouts, attrs): repeated blocks and
    re-plans ask again."""
    spec, names = _spec_names(step.kernel)
    bound = [(n, values[v]) for n, v in zip(names, step.inputs) if v]
    # attrs are JSON scalars, lists and dicts: their repr tells unequal ones apart
    key = (step.kernel, tuple((n, v.shape, v.dtype, v.layout) for n, v in bound), repr(step.attrs))
    hit = _OUTPUT_BYTES.get(key)
    if hit is None:
        if len(_OUTPUT_BYTES) > 50_000:
            _OUTPUT_BYTES.clear()
        hit = _OUTPUT_BYTES[key] = tuple(_problem_outputs(spec, bound, step.attrs))
    return list(hit)


_SPEC_NAMES: dict = {}


def _spec_names(kernel: str):
    """(spec, its input names) of ``kernel``: the names property builds a tuple per call."""
    hit = _SPEC_NAMES.get(kernel)
    if hit is None:
        from torchfl.kernels.catalog import get

        spec = get(kernel)
        hit = _SPEC_NAMES[kernel] = (spec, spec.input_names)
    return hit


def _problem_outputs(spec, bound, attrs) -> list[int]:
    """The output bytes of ``spec`` called on ``bound`` ((input name, Value) pairs)."""
    shapes = {n: v.shape for n, v in bound}
    dtypes = {n: v.dtype for n, v in bound}
    layouts = {n: _kernel_layout(v.layout, len(v.shape)) for n, v in bound}
    first = next((dtypes[n] for n in spec.input_names if n in dtypes), None)
    problem = spec.problem(shapes, attrs, None if spec.mixed_dtypes else first, layouts, dtypes)
    return [_nbytes(m.shape, m.dtype) for m in spec.output_meta(problem)]


def is_alias(step, values) -> bool:
    """A reshape of a row-major value: zero bytes, its output views its input's buffer."""
    if step.kernel != "reshape" or not step.inputs:
        return False
    v = values.get(step.inputs[0])
    if v is not None:
        return _kernel_layout(v.layout, len(v.shape)) is None
    return (step.tile or {}).get("strategy") == "metadata"


def on_host(dtype: str) -> bool:
    """A value of a dtype the chip cannot store (float64, complex, ...) lives on the host:
    no device buffer; host fallbacks read it, a link cast uploads or downloads it."""
    return bool(dtype) and not stored(dtype)


def is_link_cast(step, values) -> bool:
    """A cast between a host dtype and a chip dtype (a float64 input under the precision
    policy, a float64 output returned to the caller): the conversion happens on the link."""
    if step.kind != "cast" or not step.inputs:
        return False
    src = values.get(step.inputs[0])
    return on_host(step.attrs.get("to", "")) or (src is not None and on_host(src.dtype))


def static_steps(plan, static_inputs=()) -> tuple[frozenset, frozenset]:
    """(indices of steps that run once, names of values kept across calls): lifted
    placeholders, the ``static_inputs`` user inputs, and every output of a step whose
    inputs are all static (or a fold)."""
    positions = {int(i) for i in static_inputs}
    static_vals = {p.name for p in plan.inputs if p.kind != "input" or int(p.target) in positions}
    steps = set()
    for step in plan.steps:
        ins = [v for v in step.inputs if v]
        if (step.kind == "fold" and step.static) or (ins and (step.static or all(v in static_vals for v in ins))):
            steps.add(step.index)
            static_vals.update(o for o in step.outputs if o)
    return frozenset(steps), frozenset(static_vals)


# the cache tensors' names: the what-if decode step's (planner.lm.KV_NAME) and Dynamo's for a
# transformers DynamicCache passed to a compiled forward (``l_kwargs_cache_layers_0_keys``)
_KV_PATTERNS = (r"past_key_values_(\d+)_(key|value)$", r"cache_layers_(\d+)_(key|value)s_?$")


def kv_cache_values(plan) -> dict:
    """Values of ``plan`` that are a decoder's KV cache: ``{value: (layer, "key" | "value")}``.

    The cache enters as user inputs named as :data:`_KV_PATTERNS` say; the values made from
    them by a cast, a layout copy or a concatenation (the new token's keys appended) are
    cache too, so the grown cache a decode step returns is counted as cache, not as output."""
    import re

    found = {}
    for pin in plan.inputs:
        if pin.kind != "input":
            continue
        for pattern in _KV_PATTERNS:
            m = re.search(pattern, pin.name)
            if m:
                found[pin.name] = (int(m.group(1)), m.group(2))
                break
    if not found:
        return found
    for step in plan.steps:
        grows = step.kind in ("cast", "layout") or (step.ops and all(o.startswith("aten.cat.") for o in step.ops))
        if not grows:
            continue
        src = next((found[v] for v in step.inputs if v in found), None)
        if src is not None:
            for o in step.outputs:
                if o:
                    found[o] = src
    return found


def kv_cache_table(plan) -> list[dict]:
    """Per layer and kind (key, value): the cache as the chip holds it (the grown cache a step
    concatenates, else the past it reads), its shape, dtype and bytes."""
    best: dict = {}
    for name, (layer, kind) in kv_cache_values(plan).items():
        v = plan.values.get(name)
        if v is None:
            continue
        step = plan.steps[v.producer] if v.producer is not None else None
        grown = step is not None and bool(step.ops) and all(o.startswith("aten.cat.") for o in step.ops)
        rank = (grown, v.producer is None)     # the concatenation, else the past as it came in
        row = {"layer": layer, "kind": kind, "value": name, "shape": list(v.shape), "dtype": v.dtype,
               "bytes": _nbytes(v.shape, v.dtype)}
        if (layer, kind) not in best or rank > best[(layer, kind)][0]:
            best[(layer, kind)] = (rank, row)
    return [best[k][1] for k in sorted(best)]


def plan_memory(plan, alignment: int, capacity: int | None = None, static_inputs=()) -> MemoryPlan:
    """The :class:`MemoryPlan` of ``plan`` on a chip with ``alignment`` and ``capacity``."""
    steps = plan.steps
    static_idx, static_vals = static_steps(plan, static_inputs)
    outputs = [o for o in plan.outputs if o]
    aliasing = [is_alias(step, plan.values) for step in steps]  # a reshape viewing its input
    root = _alias_roots(steps, aliasing).get
    kv = kv_cache_values(plan)
    allocs, scratch = _allocations(plan, aliasing, set(outputs), static_inputs, kv)
    members, last = _groups(allocs, steps, root)
    out_groups = {root(o, o) for o in outputs}
    static_groups = {r for r, ms in members.items() if any(m in static_vals for m in ms)}
    resident = _resident(steps, static_idx, static_groups, out_groups, members, last)
    buffers, frees = _buffers(plan, allocs, scratch, alignment, (root, members, last, kv),
                              (resident, out_groups, static_groups))
    at_end = []
    for o in outputs:
        r = root(o, o)
        if r not in resident and r not in {root(x, x) for x in at_end}:
            at_end.append(o)
    end = len(steps)
    upload, live, peak_step, peak = _live_bytes(buffers, end)
    return MemoryPlan(
        alignment=int(alignment), capacity=None if capacity is None else int(capacity), buffers=tuple(buffers),
        live_bytes=tuple(live), upload_bytes=upload, peak_bytes=peak, peak_step=peak_step,
        resident_bytes=sum(b.nbytes for b in buffers if b.free is None),
        frees=tuple(tuple(frees.get(i, ())) for i in range(end)),
        at_end=tuple(at_end), static_steps=tuple(sorted(static_idx)))


def _alias_roots(steps, aliasing) -> dict:
    """Value -> the value whose buffer it views (a reshape shares its input's buffer: one alias
    group per buffer); a value not in it is its own root."""
    parent: dict = {}

    def find(v):
        while parent.get(v, v) != v:
            v = parent[v]
        return v

    for step, alias in zip(steps, aliasing):
        if alias and step.outputs and step.outputs[0]:
            a, b = find(step.outputs[0]), find(step.inputs[0])
            if a != b:
                parent[a] = b
    return {v: find(v) for v in parent}


def _allocations(plan, aliasing, outputs: set, static_inputs, kv) -> tuple[list, list]:
    """(allocs, scratch): every buffer the executor allocates, as (value, bytes, step, kind; -1:
    uploaded before step 0; kind None: decided by its group), and the (step, bytes) of kernel
    outputs the plan does not name."""
    values, steps = plan.values, plan.steps
    read = {v for s in steps for v in s.inputs if v} | outputs
    allocs: list = []
    user_positions = {int(i) for i in static_inputs}
    for pin in plan.inputs:
        if pin.kind != "input" and not on_host(pin.dtype):
            allocs.append((pin.name, _nbytes(pin.shape, pin.dtype), -1, "parameter"))
    for pin in plan.inputs:
        if pin.kind == "input" and pin.name in read and not on_host(pin.dtype):
            kind = "parameter" if int(pin.target) in user_positions else ("kv_cache" if pin.name in kv else "input")
            allocs.append((pin.name, _nbytes(pin.shape, pin.dtype), -1, kind))
    scratch: list = []   # (step, bytes)
    for step, alias in zip(steps, aliasing):
        if step.kind in HOST_STEPS or is_link_cast(step, values):
            for o in step.outputs:
                if o and o in values and not on_host(values[o].dtype):
                    allocs.append((o, _nbytes(values[o].shape, values[o].dtype), step.index, None))
            continue
        if alias:
            continue
        for i, nb in enumerate(_kernel_outputs(step, values)):
            o = step.outputs[i] if i < len(step.outputs) else ""
            if o:
                allocs.append((o, nb, step.index, None))
            else:
                scratch.append((step.index, nb))
    return allocs, scratch


def _groups(allocs, steps, root) -> tuple[dict, dict]:
    """(members, last): the values of each alias group (by its root) and the last step that
    reads or writes one of them."""
    members = defaultdict(list)
    last: dict = {}
    for name, _nb, at, _k in allocs:
        last.setdefault(root(name, name), at)
        members[root(name, name)].append(name)
    for step in steps:
        for v in [v for v in step.inputs if v] + [o for o in step.outputs if o]:
            r = root(v, v)
            last[r] = step.index
            if v not in members[r]:
                members[r].append(v)
    return members, last


def _resident(steps, static_idx, static_groups, out_groups, members, last) -> set:
    """The static groups kept on the device between calls: only those a per-call step (or the
    output) reads; a float32 parameter whose only reader is its static cast is freed after that
    cast, so the chip keeps the weights in the plan's dtype, once."""
    dynamic_reads = {v for s in steps if s.index not in static_idx for v in s.inputs if v}
    return {r for r in static_groups
            if r in out_groups or last.get(r, -1) < 0 or any(m in dynamic_reads for m in members[r])}


def _buffers(plan, allocs, scratch, alignment, groups, kept) -> tuple[list, dict]:
    """(buffers, frees): each allocation as a :class:`Buffer` of its kind, freed after the last
    step of its group (None: resident; the output download: after the last step), and the
    values freed after each step."""
    from torchfl.kernels.memory import accounted_bytes

    (root, members, last, kv), (resident, out_groups, static_groups) = groups, kept
    values, steps = plan.values, plan.steps
    end = len(steps)
    buffers = []
    frees = defaultdict(list)
    for name, nb, at, kind in allocs:
        r = root(name, name)
        if r in resident:
            free = None
        elif r in out_groups:
            free = end
        else:
            free = last[r]
            if name == r:
                frees[free].append(name)
        if kind is None:
            producer = steps[at]
            if r in static_groups:
                kind = "folded" if producer.kind == "fold" or _from_fold(r, values, steps) else "weight"
            elif name in kv:
                kind = "kv_cache"
            elif r in out_groups:
                kind = "output"
            else:
                kind = "activation"
        views = tuple(m for m in members[r] if m != name) if name == r else ()
        buffers.append(Buffer(name, (name,) + views, kind, accounted_bytes(nb, alignment), at, free))
    for at, nb in scratch:
        buffers.append(Buffer(f"(unused output of step {at})", (), "scratch", accounted_bytes(nb, alignment),
                              at, at))
    return buffers, frees


def _live_bytes(buffers, end: int) -> tuple[int, list, int, int]:
    """(upload bytes, bytes live at each step's high-water mark, peak step, peak bytes)."""
    upload = sum(b.nbytes for b in buffers if b.alloc < 0)
    live, now = [], upload
    by_alloc = defaultdict(int)
    by_free = defaultdict(int)
    for b in buffers:
        if b.alloc >= 0:
            by_alloc[b.alloc] += b.nbytes
        if b.free is not None and b.free < end:
            by_free[b.free] += b.nbytes
    for i in range(end):
        now += by_alloc[i]
        live.append(now)
        now -= by_free[i]
    peak_step, peak = -1, upload
    for i, n in enumerate(live):
        if n > peak:
            peak_step, peak = i, n
    return upload, live, peak_step, peak


def _from_fold(name, values, steps) -> bool:
    """Whether a static value derives from a folded constant (a cast or layout copy of one)."""
    seen = set()
    while name and name not in seen:
        seen.add(name)
        v = values.get(name)
        if v is None or v.producer is None:
            return False
        step = steps[v.producer]
        if step.kind == "fold":
            return True
        if step.kind not in ("cast", "layout") or not step.inputs:
            return False
        name = step.inputs[0]
    return False


def check_memory(plan, hcd) -> None:
    """Refuse a plan whose peak exceeds the chip's off-chip memory, with the numbers: the
    peak, the capacity, the step where it occurs and the largest buffers live then."""
    mp = plan.memory
    if mp is None or mp.fits:
        return
    where = "while uploading the inputs and parameters" if mp.peak_step < 0 else \
        f"at step {mp.peak_step} ({_step_label(plan.steps[mp.peak_step])})"
    top = mp.live_at_peak()[:5]
    largest = "; ".join(f"{b.name} ({b.kind}, {fmt_bytes(b.nbytes)})" for b in top)
    parts = ", ".join(f"{k} {fmt_bytes(n)}" for k, n in mp.breakdown().items() if n)
    cache = kv_cache_table(plan)
    advice = ("Use a smaller batch (`torchfl plan max-batch` finds the largest that fits), a smaller precision, "
              "or a chip with more off-chip memory")
    if cache:
        layers = len({c["layer"] for c in cache})
        parts += (f"; the KV cache ({layers} layers of keys and values, {cache[0]['dtype']}, [batch, heads, "
                  f"positions, head_dim] = {cache[0]['shape']} each) holds {fmt_bytes(mp.breakdown()['kv_cache'])}")
        advice = ("Use a shorter context or a smaller batch (`torchfl plan max-context` and `torchfl plan max-batch "
                  "--context N` find the largest that fit), a smaller precision, or a chip with more off-chip memory")
    raise MemoryLimitError(
        f"Plan for {plan.chip} needs {fmt_bytes(mp.peak_bytes)} ({mp.peak_bytes} B) of device memory {where}, "
        f"more than the chip's {fmt_bytes(mp.capacity)} ({mp.capacity} B, HCD field "
        f"memory.off_chip_memory.size_gb); live then: {parts}; largest buffers: {largest}. {advice}",
        mp, field="memory.off_chip_memory.size_gb", limit=mp.capacity, value=mp.peak_bytes,
        node=None if mp.peak_step < 0 else plan.steps[mp.peak_step].outputs[:1])


def check_weights(ir, hcd, chip) -> None:
    """Refuse, before any search, a graph whose parameters alone exceed the chip's off-chip
    memory: every parameter, buffer and constant is uploaded before step 0 in its graph dtype
    (module docstring), so their accounted bytes are a lower bound of any plan's peak (a 70B
    float16 model on an 80 GB chip was refused only after a whole plan, ~1 min). The error's
    ``memory`` holds those uploads, so ``plan memory`` still shows what does not fit."""
    from torchfl.kernels.memory import accounted_bytes

    cap = chip.memory_bytes
    if cap is None:
        return
    params = [(name, accounted_bytes(_nbytes(info.shape, info.graph_dtype), chip.alignment), info.graph_dtype)
              for name, kind, _t, info in ir.placeholders if kind != "input" and not on_host(info.graph_dtype)]
    need = sum(nb for _n, nb, _d in params)
    if need <= cap:
        return
    buffers = tuple(Buffer(name, (name,), "parameter", nb, -1, None) for name, nb, _d in params)
    mp = MemoryPlan(alignment=int(chip.alignment), capacity=int(cap), buffers=buffers, live_bytes=(),
                    upload_bytes=need, peak_bytes=need, peak_step=-1, resident_bytes=need, frees=(), at_end=(),
                    static_steps=())
    dtypes = ", ".join(sorted({d for _n, _nb, d in params}))
    chips = -(-need // cap)
    raise MemoryLimitError(
        f"the model's {len(params)} parameters alone need {fmt_bytes(need)} ({need} B, {dtypes}) of device memory, "
        f"more than {hcd.chip.name}'s {fmt_bytes(cap)} ({cap} B, HCD field memory.off_chip_memory.size_gb); refused "
        f"before planning. Try int8 weights (a PT2E-quantised model: about half of float16's bytes), a chip with at "
        f"least {fmt_bytes(need)} of off-chip memory, or {chips} or more chips of this kind with the model split "
        "across them (torchfl plans one chip: plan one shard)",
        mp, field="memory.off_chip_memory.size_gb", limit=cap, value=need)


def _step_label(step) -> str:
    if step.kind in ("cast", "layout"):
        return f"{step.kernel} of {step.inputs[0] if step.inputs else '?'}"
    ops = "+".join(o.removeprefix("aten.").rsplit(".", 1)[0] for o in step.ops)
    return f"{step.kernel or step.kind} {ops}".strip()
