"""HCD format 1.2: where every performance number comes from, in a form a program reads.

Two optional top-level sections. ``sources`` names each reference once (a datasheet, a
microbenchmark with the benchmark it ran, a stated class ``assumption``, or a number
``fitted`` on the fidelity rows it names); ``provenance`` maps a number's dotted canonical
path to a source id. Fidelity reads ``fitted`` sources to tell in-sample rows from
out-of-sample ones, and the planner's confidence reads the kinds (an ``assumption`` prices a
prediction without evidence). A file without the sections is format 1.0/1.1 unchanged:
empty sections are not part of the canonical form, so its content hash stays.

This module holds the section's model (:class:`Source`), the one list of numbers the cost
model reads (:data:`PERFORMANCE_FIELDS`), the :class:`HCD` methods over them
(:class:`ProvenanceView`), and the located checks :mod:`torchfl.hcd.validate` runs.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from typing import TYPE_CHECKING, Annotated, Any, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

if TYPE_CHECKING:
    from torchfl.hcd.diagnostics import Diagnostic
    from torchfl.hcd.source import LocatedDocument

SOURCE_KINDS = ("datasheet", "microbenchmark", "assumption", "fitted")
BENCHMARKS = ("gemm-sweep", "copy-bandwidth", "launch-latency", "cache-bandwidth", "collective-bandwidth", "other")
SOURCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
UNSTATED = "unstated"
MAX_SOURCES = 256
MAX_ROWS = 1024

_FLOAT_UNITS = ("fp16", "bf16", "fp32")
#: ``execution`` numbers; a test keeps this equal to the numeric fields of ``model.Execution``.
EXECUTION_FIELDS = ("launch_overhead_us", "matrix_launch_overhead_us", "graph_launch_overhead_us",
                    "concurrent_tiles", "tile_elements", "row_resident_elements")

#: ``interconnect`` numbers (format 1.2, read by multi-chip plans only)
INTERCONNECT_FIELDS = ("interconnect.links.count", "interconnect.links.bandwidth_gb_per_s",
                       "interconnect.sustained_fraction", "interconnect.latency_us",
                       "interconnect.collective_overhead_us")

#: Every number the cost model reads, as dotted canonical paths (``<unit>`` expanded).
PERFORMANCE_FIELDS: tuple[str, ...] = (
    *(f"compute_units.{u}.{f}" for u in _FLOAT_UNITS for f in ("peak_tflops", "sustained_fraction", "count")),
    *(f"compute_units.int8.{f}" for f in ("peak_tops", "sustained_fraction", "count")),
    "memory.on_chip_cache.size_kb",
    "memory.on_chip_cache.bandwidth_gb_per_s",
    "memory.off_chip_memory.bandwidth_gb_per_s",
    "memory.off_chip_memory.sustained_fraction",
    *(f"execution.{f}" for f in EXECUTION_FIELDS),
    *INTERCONNECT_FIELDS,
)


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        close = difflib.get_close_matches(value, allowed, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise ValueError(f"unknown {what} {value!r}{hint} Write one of: {', '.join(allowed)}")
    return value


def _kind(value: str) -> str:
    return _choice(value, SOURCE_KINDS, "source kind")


def _benchmark(value: str) -> str:
    return _choice(value, BENCHMARKS, "benchmark")


def _rows(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class Source(BaseModel):
    """One named reference of an HCD's numbers (format 1.2)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)

    kind: Annotated[str, AfterValidator(_kind)] = Field(
        description="datasheet | microbenchmark | assumption | fitted.",
        json_schema_extra={"enum": list(SOURCE_KINDS)})
    ref: str = Field(min_length=1, max_length=2000,
                     description="The full reference: document, who measured, where published, which version.")
    benchmark: Optional[Annotated[str, AfterValidator(_benchmark),
                                  WithJsonSchema({"type": "string", "enum": list(BENCHMARKS)})]] = Field(
        default=None, description="Required for a microbenchmark: " + " | ".join(BENCHMARKS) + ".")
    table: Optional[str] = Field(
        default=None, min_length=1, max_length=200,
        description="The bundled measurements/microbench/<table>.csv the number was derived from (stem).")
    rows: Annotated[tuple[Annotated[str, Field(min_length=1, max_length=200)], ...], BeforeValidator(_rows)] = Field(
        default=(), max_length=MAX_ROWS,
        description="Required for fitted: the fidelity tables (file stems) or row source ids it was fitted on.")


class ProvenanceView:
    """The methods over ``sources`` and ``provenance`` of an :class:`~torchfl.hcd.model.HCD` and a
    :class:`~torchfl.hcd.system.System`, and their canonical form (what the registry hashes)."""

    sources: dict[str, Source]
    provenance: dict[str, str]

    def canonical(self) -> dict:
        """Canonical keys and units, absent optionals (and empty 1.2 sections) dropped;
        JSON-serialisable. A 1.0/1.1 file's canonical form, hence its content hash, is the
        one it had before format 1.2."""
        out = self.model_dump(mode="json", exclude_none=True)
        for section in ("sources", "provenance"):
            if not out.get(section):
                out.pop(section, None)
        return out

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    def content_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def source_of(self, path: str) -> Source | None:
        """The source the file states for the number at dotted ``path``, or None."""
        sid = self.provenance.get(path)
        return None if sid is None else self.sources.get(sid)

    def kind_of(self, path: str) -> str:
        """The kind of ``path``'s source, or ``"unstated"`` when the file gives none."""
        src = self.source_of(path)
        return UNSTATED if src is None else src.kind

    def performance_numbers(self) -> dict[str, float]:
        """Each :data:`PERFORMANCE_FIELDS` path the file sets -> its value, in that order."""
        out = {}
        for path in PERFORMANCE_FIELDS:
            value = _attr_path(self, path)
            if value is not None:
                out[path] = float(value)
        return out

    def fitted_rows(self) -> frozenset[str]:
        """Every table stem or row source id named by a ``fitted`` source some path uses."""
        used = set(self.provenance.values())
        return frozenset(r for sid, s in self.sources.items() if sid in used and s.kind == "fitted" for r in s.rows)


def _attr_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


# --------------------------------------------------------------------------- located checks


def _numbers(data: Any, prefix: tuple = ()) -> dict[str, tuple]:
    """Dotted path -> key path of every numeric leaf of the raw document (not the 1.2 sections)."""
    out: dict[str, tuple] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            if not prefix and key in ("sources", "provenance"):
                continue
            if isinstance(key, str):
                out.update(_numbers(value, prefix + (key,)))
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        out[".".join(prefix)] = prefix
    return out


def _close(word: str, choices, cutoff: float = 0.6) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_provenance(doc: "LocatedDocument", data: dict) -> list["Diagnostic"]:
    """Cross-field rules of format 1.2 on the raw data (pass 3 of validation), each located.

    Type and syntax of each field are pass 2's (the pydantic model): these rules are the ones
    that read two places at once (a path against the numbers present, an id against ``sources``).
    """
    sources = data.get("sources")
    prov = data.get("provenance")
    if sources is None and prov is None:
        return []
    out: list = []
    sources = sources if isinstance(sources, dict) else {}
    for sid, body in sources.items():
        out.extend(_check_source(doc, sid, body))
    if not isinstance(prov, dict):
        prov = {}
    numbers = _numbers(data)
    used: dict[str, list[str]] = {}
    for path, sid in prov.items():
        where = ("provenance", path)
        if not isinstance(path, str):
            continue
        if path not in numbers:
            if path in PERFORMANCE_FIELDS:
                msg = f"{path} names no number present in the file; set the number or remove this line"
            else:
                hint = _close(path, numbers) or "; write a dotted path such as compute_units.fp16.peak_tflops"
                msg = f"{path} names no number of the file{hint}"
            out.append(doc.diagnostic(where, msg, key=True))
        if not isinstance(sid, str):
            continue  # pass 2: expected a string
        if sid not in sources:
            known = ", ".join(sorted(str(s) for s in sources)) or "none"
            hint = _close(sid, [str(s) for s in sources]) or "."
            out.append(doc.diagnostic(where, f"unknown source {sid!r}{hint} Sources of this file: {known}; "
                                             "add it under sources: or use one of those"))
        else:
            used.setdefault(sid, []).append(path)
    for sid, paths in used.items():
        body = sources.get(sid)
        if isinstance(body, dict) and body.get("kind") == "fitted":
            rows = body.get("rows") if isinstance(body.get("rows"), list) else []
            names = ", ".join(str(r) for r in rows) or "(none)"
            out.append(doc.diagnostic(
                ("sources", sid, "kind"),
                f"{', '.join(paths)} fitted on rows {names}: fidelity scores on those tables are in-sample; "
                "replace it by a microbenchmark or a datasheet number", "warning"))
    for path in PERFORMANCE_FIELDS:
        if path in numbers and path not in prov:
            out.append(doc.diagnostic(numbers[path], "no provenance: add the line "
                                                     f"'{path}: <source id>' under provenance:", "warning", key=True))
    return out


def _check_source(doc, sid, body) -> list:
    out = []
    if not isinstance(sid, str) or not SOURCE_ID.fullmatch(sid):
        out.append(doc.diagnostic(("sources", sid), f"source id {str(sid)!r} is not valid; use letters, digits, "
                                                    "'.', '_' or '-' (at most 64), e.g. nv-datasheet", key=True))
    if not isinstance(body, dict):
        return out  # pass 2: expected a mapping
    kind = body.get("kind")
    if kind == "microbenchmark" and body.get("benchmark") is None:
        out.append(doc.diagnostic(("sources", sid, "kind"), "a microbenchmark source states which benchmark: add "
                                                            f"benchmark: one of {', '.join(BENCHMARKS)}"))
    if kind == "fitted" and not body.get("rows"):
        out.append(doc.diagnostic(("sources", sid, "kind"), "a fitted source names the rows it was fitted on: add "
                                                            "rows: [<fidelity table stem or row source id>, ...]"))
    if kind in SOURCE_KINDS and kind != "microbenchmark" and body.get("benchmark") is not None:
        out.append(doc.diagnostic(("sources", sid, "benchmark"), f"benchmark goes with kind microbenchmark, "
                                                                 f"not {kind}; remove it or change the kind",
                                  key=True))
    if kind in SOURCE_KINDS and kind != "fitted" and body.get("rows"):
        out.append(doc.diagnostic(("sources", sid, "rows"), f"rows go with kind fitted, not {kind}; remove them "
                                                            "or change the kind", key=True))
    return out
