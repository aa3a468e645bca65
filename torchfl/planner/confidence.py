"""How far to trust a predicted time: how much of it stands on assumed numbers, and how well
the chip's predictions are checked on measurements no number was set from.

Why: a what-if answer (compare, decode tokens/s, explain's per-call time) is only as good as
the HCD numbers that priced it. HCD format 1.2 says where each number comes from
(``hcd.kind_of(path)``: ``datasheet``, ``microbenchmark``, ``assumption``, ``fitted``; a
1.0 / 1.1 file, or a number without a source, is ``unstated``). This module reads which numbers
priced which share of a plan's time (:mod:`torchfl.planner.terms`: the launch term reads the
launch cost, the compute term the dtype's unit's peak and sustained fraction, the off-chip term
the off-chip bandwidth and its sustained fraction, the cache term the cache's bandwidth, a host
round trip the off-chip bandwidth) and the registry's fidelity evidence
(:func:`torchfl.registry.fidelity.fidelity_summary`: rows scored out of sample).

``assumption_share``: the share of the per-call predicted time priced by terms at least one of
whose numbers is ``assumption`` or ``unstated`` (a term is as firm as its weakest number). A number
the file does not state at all is ``unstated`` too, and where the model then prices it as nothing
(a launch cost absent: 0 us; a sustained fraction absent: 100% of the peak) it is also listed in
``missing``: such a chip looks faster than it is, and ``plan compare`` ranks it by
:func:`rank_time` (see there).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torchfl.planner.terms import plan_terms

__all__ = ["WEAK_KINDS", "Confidence", "confidence", "number_kind", "term_numbers", "fidelity_evidence",
           "rank_time", "RANK_RULE"]

#: the kinds a term counts as assumed for
WEAK_KINDS = ("assumption", "unstated")

#: the ranking rule ``plan compare`` applies, in the words it prints
RANK_RULE = ("ranked as if each missing launch cost or sustained fraction were the least costly value "
             "another chip compared states for it")


def _value(hcd, path: str):
    obj = hcd
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def number_kind(hcd, path: str) -> str:
    """The provenance kind of the number at ``path`` (``hcd.kind_of``; ``unstated`` for a file
    that states none, HCD 1.0 / 1.1)."""
    return hcd.kind_of(path)


def _unit(hcd, chip, dtype: str) -> str | None:
    """The compute unit whose numbers price ``dtype`` (as ``ChipModel.peak_for`` picks it)."""
    unit = hcd.unit_for(dtype)
    if unit is not None:
        return unit
    if dtype in ("int32", "int64", "bool") and hcd.unit_for("int8") is not None:
        return "int8"
    if chip.peak:
        slowest = min(chip.peak, key=chip.peak.get)
        return hcd.unit_for(slowest)
    return None


def _launch_path(hcd, chip, kernel: str) -> str:
    if chip.graph_priced:
        return "execution.graph_launch_overhead_us"
    if chip.matrix_launch_s is not None and kernel:
        from torchfl.kernels.catalog import CATALOG
        from torchfl.kernels.chip import MATRIX_FAMILIES

        spec = CATALOG.get(kernel)
        if spec is not None and spec.family in MATRIX_FAMILIES:
            return "execution.matrix_launch_overhead_us"
    return "execution.launch_overhead_us"


def term_numbers(term: str, hcd, chip, dtype: str = "", kernel: str = "") -> tuple[str, ...]:
    """The dotted HCD paths of the numbers that price ``term`` for a ``dtype`` step of ``kernel``."""
    if term == "launch":
        return (_launch_path(hcd, chip, kernel),)
    if term == "compute":
        unit = _unit(hcd, chip, dtype)
        if unit is None:
            return ()
        return (f"compute_units.{unit}.{'peak_tops' if unit == 'int8' else 'peak_tflops'}",
                f"compute_units.{unit}.sustained_fraction")
    if term == "off-chip":
        return ("memory.off_chip_memory.bandwidth_gb_per_s", "memory.off_chip_memory.sustained_fraction")
    if term == "on-chip cache":
        return ("memory.on_chip_cache.bandwidth_gb_per_s",)
    if term == "host link":
        return ("memory.off_chip_memory.bandwidth_gb_per_s",)
    raise ValueError(f"unknown term {term!r}")


#: numbers the cost model prices as nothing when the file leaves them out
_FREE_WHEN_ABSENT = ("launch_overhead_us", "sustained_fraction")


@dataclass(frozen=True)
class Confidence:
    """What a prediction stands on (see the module's docstring).

    ``checked_rows`` / ``out_of_sample_mae``: the chip's latest fidelity run, its planned rows no
    number was set from and their mean absolute error (0 / None: unchecked, stale or unknown:
    ``state`` says which). ``assumption_share`` in [0, 1]. ``unstated`` / ``assumed``: the numbers
    of kind unstated / assumption that priced a term of this time (a launch priced as nothing too); ``missing``: numbers absent from the
    file that this prediction would read (priced as nothing); ``shares``: share of the time per
    term (launch, compute, off-chip, on-chip cache, host link)."""

    checked_rows: int
    out_of_sample_mae: float | None
    assumption_share: float
    unstated: tuple[str, ...] = ()
    assumed: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    state: str = "unchecked"
    shares: dict = field(default_factory=dict)

    def checked_text(self) -> str:
        """How well the chip is checked out of sample, in words."""
        if self.state == "checked" and self.checked_rows and self.out_of_sample_mae is not None:
            return f"checked out of sample on {self.checked_rows} rows, mean error {self.out_of_sample_mae:.0%}"
        return {"stale": "out-of-sample check stale (the chip changed since)",
                "checked": "no out-of-sample rows checked",
                "unknown": "out-of-sample check not looked up"}.get(self.state, "not checked out of sample")

    def line(self, checked: bool = True) -> str:
        """One sentence: the share assumed, the time by term, the numbers left out, and (``checked``)
        the out-of-sample check."""
        text = f"confidence: {self.assumption_share:.0%} of this time priced from assumed or unstated numbers"
        shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(self.shares.items(), key=lambda kv: -kv[1]) if v >= 0.005)
        if shares:
            text += f" (time by term: {shares})"
        if self.missing:
            text += f"; not stated, priced as nothing: {', '.join(self.missing)}"
        return text + (f"; {self.checked_text()}" if checked else "")

    @classmethod
    def from_dict(cls, d: dict) -> "Confidence":
        """Inverse of :meth:`to_dict` (a row's JSON back to the object that words it)."""
        return cls(d["checked_rows"], d["out_of_sample_mae"], d["assumption_share"], tuple(d["unstated"]),
                   tuple(d["assumed"]), tuple(d["missing"]), d["state"], dict(d["shares"]))

    def to_dict(self) -> dict:
        return {"checked_rows": self.checked_rows, "out_of_sample_mae": self.out_of_sample_mae,
                "assumption_share": round(self.assumption_share, 4), "unstated": list(self.unstated),
                "assumed": list(self.assumed), "missing": list(self.missing), "state": self.state,
                "shares": {k: round(v, 4) for k, v in self.shares.items()}}


def _evidence(summary: dict | None) -> tuple[int, float | None, str]:
    if not summary:
        return 0, None, "unknown"
    state = summary.get("state", "unchecked")
    if state != "checked":
        return 0, None, state
    return int(summary.get("out_of_sample") or 0), summary.get("out_of_sample_mean_abs_error"), state


def confidence(plans, target, summary: dict | None = None) -> Confidence:
    """The confidence of the per-call time of ``plans`` (one plan or several: a training step's
    forward and backward) on ``target`` (a resolved Target: its HCD and ChipModel);
    ``summary``: :func:`fidelity_evidence`'s entry for the chip (None: not looked up, ``unknown``)."""
    plans = [p for p in (plans if isinstance(plans, (list, tuple)) else [plans]) if p is not None]
    hcd, chip = target.hcd, target.model
    weak: dict[str, str] = {}
    missing: set = set()
    times: dict[str, float] = {}
    assumed_s = total = 0.0
    for plan in plans:
        for t in plan_terms(plan, chip):
            parts = [("launch", t.launch_s), (t.bound, t.body_s)] if t.launch_s else [(t.bound, t.body_s)]
            if t.time_s > 0 and not t.launch_s and t.bound != "host link" and t.kernel:
                parts.append(("launch", 0.0))          # a chip kernel whose launch the chip prices as nothing
            for term, seconds in parts:
                times[term] = times.get(term, 0.0) + seconds
                total += seconds
                paths = term_numbers(term, hcd, chip, t.dtype, t.kernel)
                firm = True
                for path in paths:
                    kind = number_kind(hcd, path)
                    if kind in WEAK_KINDS:
                        firm = False
                        weak.setdefault(path, kind)
                    if _value(hcd, path) is None and path.rsplit(".", 1)[-1] in _FREE_WHEN_ABSENT \
                            and not (term == "launch" and t.launch_s):
                        missing.add(path)
                if not firm:
                    assumed_s += seconds
    rows, mae, state = _evidence(summary)
    share = assumed_s / total if total > 0 else 0.0
    return Confidence(rows, mae, min(1.0, share),
                      tuple(sorted(p for p, k in weak.items() if k == "unstated")),
                      tuple(sorted(p for p, k in weak.items() if k == "assumption")),
                      tuple(sorted(missing)), state,
                      {k: (v / total if total > 0 else 0.0) for k, v in times.items()})


def fidelity_evidence(registry, names) -> dict[str, dict]:
    """chip name -> ``fidelity_summary`` of the chip in ``registry`` (a URL, a Registry or None:
    the default); a registry that cannot be read gives ``{"state": "unknown"}`` for each."""
    from torchfl.registry import RegistryError, open_registry
    from torchfl.registry.fidelity import fidelity_summary

    out = {}
    try:
        reg = open_registry(registry)
        for name in names:
            try:
                out[name] = fidelity_summary(reg, name)
            except RegistryError:
                out[name] = {"chip": name, "state": "unknown"}
    except RegistryError:
        out = {n: {"chip": n, "state": "unknown"} for n in names}
    return out


def rank_time(time_s: float, plans, target, peers) -> float:
    """The per-call time ``plan compare`` ranks a chip by: its own, but with each number that
    prices this plan as nothing because the file leaves it out (a launch cost, a sustained
    fraction) priced at the least costly value another compared chip states for it
    (``peers``: their Targets): never ranked first only because a number is missing, and never
    charged more than the most favourable peer. Equal to ``time_s`` where nothing is missing or
    no peer states the number."""
    plans = [p for p in (plans if isinstance(plans, (list, tuple)) else [plans]) if p is not None]
    chip = target.model
    others = [p.model for p in peers if p.name != target.name]
    if not plans or not others:
        return time_s
    launching = [m for m in others if m.launch_s > 0 or m.matrix_launch_s]
    offs = [m.offchip_sustained for m in others if m.offchip_sustained != 1.0]
    extra = 0.0
    for plan in plans:
        for t in plan_terms(plan, chip):
            if t.time_s <= 0 or t.bound == "host link" or not t.kernel:
                continue
            if not t.launch_s and launching and _value(target.hcd, _launch_path(target.hcd, chip, t.kernel)) is None:
                # what each peer charges this kernel's launch
                extra += min(m.launch_for(t.kernel) for m in launching)
            if t.bound == "compute" and t.dtype and t.kernel:
                stated = [m.sustained_for(t.dtype) for m in others if m.sustained_for(t.dtype) != 1.0]
                paths = term_numbers("compute", target.hcd, chip, t.dtype)
                if stated and paths and _value(target.hcd, paths[-1]) is None:
                    extra += t.body_s * (1.0 / max(stated) - 1.0)
            elif t.bound == "off-chip" and offs and _value(target.hcd, "memory.off_chip_memory.sustained_fraction") is None:
                extra += t.body_s * (1.0 / max(offs) - 1.0)
    return time_s + extra
