"""Validation of HCD files: every problem at once, each located and actionable.

Three passes over one located document, all collecting diagnostics:

1. **Normalise** legacy unit keys (``peak_gflops``/``peak_gops``, TFLOPS/TOPS per the
   source article) to the canonical ones, warning where they were.
2. **Structure** through the pydantic model: required fields, types, unknown fields
   (with "did you mean"), numeric ranges, layout and dtype syntax.
3. **Consistency** across fields, on the raw data so it runs even when pass 2 failed.

An HCD with any error is never returned: :func:`check_hcd` gives diagnostics,
:func:`load_hcd` raises :class:`HCDError`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from torchfl.hcd.diagnostics import Diagnostic, FileReport, HCDError, YAMLLoadError, errors
from torchfl.hcd.dtypes import MATRIX_UNITS, UNIT_OF_DTYPE, short_dtype
from torchfl.hcd.model import HCD, LAYOUT
from torchfl.hcd.provenance import check_provenance
from torchfl.hcd.source import LocatedDocument, located_yaml, read_source

# legacy key -> (canonical key, unit kinds where it is legal)
LEGACY_KEYS = {
    "peak_gflops": ("peak_tflops", ("fp16", "bf16", "fp32")),
    "peak_gops": ("peak_tops", ("int8",)),
}


@dataclass
class HCDReport(FileReport):
    """Outcome of checking one HCD file. ``hcd`` is set only when there is no error."""

    hcd: HCD | None = None


def check_hcd(path: str | Path) -> HCDReport:
    """Read and validate one HCD file. Never raises for bad input."""
    text, diagnostics, readable = read_source(path, "an HCD file")
    if text is None:
        return HCDReport(str(path), diagnostics=diagnostics, readable=readable)
    return check_hcd_text(text, str(path))


def check_hcd_text(text: str, filename: str = "<string>") -> HCDReport:
    """Validate HCD source text. Never raises for bad input."""
    report = HCDReport(filename, source=text)
    try:
        doc = located_yaml(text, filename, keep_going=True)
    except YAMLLoadError as exc:
        report.diagnostics = exc.diagnostics
        return report
    report.hcd, report.diagnostics = _validate_document(doc)
    return report


def load_hcd(path: str | Path) -> HCD:
    """Load a valid HCD or raise :class:`HCDError` listing every problem."""
    return _require(check_hcd(path))


def load_hcd_text(text: str, filename: str = "<string>") -> HCD:
    return _require(check_hcd_text(text, filename))


def _require(report: HCDReport) -> HCD:
    if not report.ok or report.hcd is None:
        raise HCDError(report.diagnostics)
    return report.hcd


# --------------------------------------------------------------------------- passes


def _validate_document(doc: LocatedDocument) -> tuple[HCD | None, list[Diagnostic]]:
    out: list[Diagnostic] = []
    if not isinstance(doc.data, dict):
        kind = type(doc.data).__name__
        out.append(doc.diagnostic((), f"the document is a {kind}; an HCD is a mapping with sections "
                                      "chip, compute_units, memory, tensor and constraints"))
        return None, out
    if "system" in doc.data and "chips" in doc.data and "chip" not in doc.data:
        return None, [doc.diagnostic(("system",), "this is a system descriptor (N chips of an HCD), not an HCD: check "
                                                  "it with `torchfl system validate FILE`", key=True)]
    data = _normalise_units(doc, out)
    hcd = None
    try:
        hcd = HCD.model_validate(data)
    except ValidationError as exc:
        out.extend(_structure_diagnostics(doc, exc))
    out.extend(_consistency(doc, data))
    # the loader's problems (duplicate keys, refused tags) beside these: one problem, one
    # diagnostic, so nothing is said again about a value the loader refused
    out = [d for d in out if not doc.is_refused(d.path)] + doc.problems
    out.sort()
    if errors(out):
        return None, out
    hcd._warnings = tuple(out)
    return hcd, out


def _normalise_units(doc: LocatedDocument, out: list[Diagnostic]) -> dict:
    data = dict(doc.data)
    units = data.get("compute_units")
    if not isinstance(units, dict):
        return data
    units = dict(units)
    for kind, body in units.items():
        if not isinstance(body, dict):
            continue
        body = dict(body)
        for legacy, (canonical, kinds) in LEGACY_KEYS.items():
            if legacy not in body:
                continue
            path = ("compute_units", kind, legacy)
            if kind not in kinds:
                continue  # left in place: pass 2 reports it as unknown, with a hint
            if canonical in body:
                out.append(doc.diagnostic(path, f"both {legacy} and {canonical} are given; keep only "
                                                f"{canonical} (in {_unit_word(canonical)})", key=True))
                body.pop(legacy)
                continue
            out.append(doc.diagnostic(
                path,
                f"{legacy} is ambiguous: its name says G but the value is read as "
                f"{_unit_word(canonical)} (the source article's meaning); rename it to {canonical}",
                "warning", key=True))
            body[canonical] = body.pop(legacy)
            # positions follow the value to its canonical path, so later errors point at it
            doc.value_pos[("compute_units", kind, canonical)] = doc.where(path)
            doc.key_pos[("compute_units", kind, canonical)] = doc.where(path, key=True)
        units[kind] = body
    data["compute_units"] = units
    return data


def _unit_word(key: str) -> str:
    return "TFLOPS" if key == "peak_tflops" else "TOPS"


_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "string_type": "a string",
    "bool_type": "true or false", "bool_parsing": "true or false", "list_type": "a list", "tuple_type": "a list",
    "model_type": "a mapping", "dict_type": "a mapping", "model_attributes_type": "a mapping",
}


def _structure_diagnostics(doc: LocatedDocument, exc: ValidationError, root: type[BaseModel] = HCD) -> list[Diagnostic]:
    """Pydantic's errors of ``root`` (the HCD, or another descriptor of the hcd package such as a
    system) as located diagnostics: what, where, how to fix, with did-you-mean for unknown keys."""
    out = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        kind = err["type"]
        value = err.get("input")
        model = _model_at(loc[:-1], root)
        if kind == "missing":
            desc = _describe(model, loc[-1])
            out.append(doc.diagnostic(loc, f"required field {loc[-1]!r} is missing; add it{desc}"))
        elif kind == "extra_forbidden":
            out.append(doc.diagnostic(loc, _unknown_field(loc, model), key=True))
        elif kind in _TYPE_WORDS:
            expected = _TYPE_WORDS[kind]
            hint = ""
            if loc[-1] == "version" and isinstance(value, (int, float)):
                hint = '; quote it and write MAJOR.MINOR.PATCH, e.g. "1.0.0"'
            out.append(doc.diagnostic(loc, f"expected {expected}, got {_show(value)}{hint}"))
        elif kind in {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}:
            ctx = err.get("ctx", {})
            bound = next(iter(ctx.values()))
            op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
            desc = _describe(model, loc[-1])
            out.append(doc.diagnostic(loc, f"must be {op} {bound:,} to be plausible, got {_show(value)}{desc}"))
        elif kind == "finite_number":
            out.append(doc.diagnostic(loc, f"expected a finite number, got {_show(value)}{_describe(model, loc[-1])}"))
        elif kind in {"too_short", "too_long"}:
            out.append(doc.diagnostic(loc, f"{err['msg'].lower()}; got {_show(value)}"))
        elif kind == "value_error":
            out.append(doc.diagnostic(loc, err["msg"].removeprefix("Value error, ")))
        else:
            out.append(doc.diagnostic(loc, f"{err['msg']}, got {_show(value)}"))
    return out


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _model_at(path: tuple, root: type[BaseModel] = HCD) -> type[BaseModel] | None:
    """The pydantic model class that describes the mapping at ``path``."""
    model: Any = root
    keyed = False     # the last field was a mapping of models (sources: id -> Source): skip the id
    for part in path:
        if keyed:
            keyed = False
            continue
        if isinstance(part, int) or model is None:
            return None
        info = model.model_fields.get(part)
        if info is None:
            return None
        keyed = getattr(info.annotation, "__origin__", None) is dict
        model = _inner_model(info.annotation)
    return None if keyed else model


def _inner_model(annotation) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found:
            return found
    return None


def _describe(model, name) -> str:
    if model is None or name not in getattr(model, "model_fields", {}):
        return ""
    desc = model.model_fields[name].description
    return f" ({desc[0].lower() + desc[1:].rstrip('.')})" if desc else ""


def _unknown_field(loc: tuple, model) -> str:
    name = str(loc[-1])
    allowed = sorted(model.model_fields) if model else []
    parent = ".".join(str(p) for p in loc[:-1]) or "the top level"
    hint = ""
    if name in LEGACY_KEYS or name in {"peak_tops", "peak_tflops"}:
        unit = loc[-2] if len(loc) >= 2 else ""
        right = "peak_tops" if unit == "int8" else "peak_tflops"
        hint = f"; a {unit} unit states its rate as {right}"
    else:
        close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
        if close:
            hint = f"; did you mean {close[0]!r}?"
    sentence = f"unknown field {name!r}{hint}"
    sentence += "" if sentence.endswith("?") else "."
    listing = f" Allowed in {parent}: {', '.join(allowed)}." if allowed else ""
    return sentence + listing


# --------------------------------------------------------------------------- consistency


def _get(data: Any, *path):
    for part in path:
        if isinstance(part, int):
            if not isinstance(data, list) or part >= len(data):
                return None
        elif not isinstance(data, dict):
            return None
        data = data[part] if isinstance(part, int) else data.get(part)
    return data


def _consistency(doc: LocatedDocument, data: dict) -> list[Diagnostic]:
    """Cross-field rules (SPEC §3), tolerant of missing or mistyped parts."""
    out: list[Diagnostic] = []
    units = _get(data, "compute_units") if isinstance(_get(data, "compute_units"), dict) else {}
    present = [u for u in MATRIX_UNITS if isinstance(units.get(u), dict)]
    if isinstance(_get(data, "compute_units"), dict) and not present:
        out.append(doc.diagnostic(("compute_units",), "no compute unit: declare at least one of "
                                                      "fp16, bf16, fp32, int8", key=True))
    dtypes_raw = _get(data, "tensor", "supported_dtypes")
    dtypes = [d for d in dtypes_raw if isinstance(d, str)] if isinstance(dtypes_raw, list) else []
    short = [short_dtype(d) for d in dtypes]
    emulation = _get(data, "constraints", "bfloat16_emulation") is True
    out.extend(_duplicates(doc, ("tensor", "supported_dtypes"), dtypes_raw, "{} is listed twice"))
    out.extend(_dtype_units(doc, short, present, emulation))
    if emulation:
        out.extend(_bf16_emulation(doc, short, present))
    out.extend(_layouts(doc, data, units, present))
    out.extend(_execution(doc, _get(data, "execution")))
    out.extend(_attention(doc, data, units))
    out.extend(check_provenance(doc, data))
    return out


def _dtype_units(doc: LocatedDocument, short: list[str], present: list[str], emulation: bool) -> list[Diagnostic]:
    """Every listed dtype has a unit that runs it; every unit's dtype is listed."""
    out = []
    for i, d in enumerate(short):
        unit = UNIT_OF_DTYPE.get(d)
        if unit is None or unit in present:
            continue
        path = ("tensor", "supported_dtypes", i)
        if d == "bfloat16" and "fp16" in present:
            if not emulation:
                out.append(doc.diagnostic(path, "torch.bfloat16 is listed but there is no bf16 unit: bfloat16 "
                                                "will run on the fp16 unit at its peak rate (explain says so); "
                                                "add a bf16 unit if the ALU is native", "warning"))
            continue
        out.append(doc.diagnostic(path, f"torch.{d} is listed but no compute unit runs it; add a "
                                        f"compute_units.{unit} section or remove torch.{d}"))
    for unit in present:
        dtype = next(d for d, u in UNIT_OF_DTYPE.items() if u == unit)
        if short and dtype not in short and not (unit == "fp16" and emulation):
            out.append(doc.diagnostic(("compute_units", unit), f"the {unit} unit is declared but torch.{dtype} "
                                                                "is not in tensor.supported_dtypes, so it will "
                                                                "not be used; list the dtype or drop the unit",
                                      "warning", key=True))
    return out


def _bf16_emulation(doc: LocatedDocument, short: list[str], present: list[str]) -> list[Diagnostic]:
    """bfloat16 native vs emulated: the flag excludes a native bf16 dtype or unit, needs fp16."""
    out = []
    if "bfloat16" in short:
        out.append(doc.diagnostic(("tensor", "supported_dtypes", short.index("bfloat16")),
                                  "torch.bfloat16 (a native bf16 ALU) contradicts "
                                  "constraints.bfloat16_emulation: true; an emulating chip lists "
                                  "torch.float16 only and sets the flag"))
    if "bf16" in present:
        out.append(doc.diagnostic(("compute_units", "bf16"), "a bf16 unit contradicts "
                                                             "bfloat16_emulation: true; remove one", key=True))
    if "float16" not in short or "fp16" not in present:
        out.append(doc.diagnostic(("constraints", "bfloat16_emulation"),
                                  "bfloat16_emulation computes bf16 through float16: list "
                                  "torch.float16 and declare an fp16 unit", key=True))
    return out


def _listed_layouts(doc: LocatedDocument, units: dict, present: list[str], out: list[Diagnostic]):
    """(path, layout) of every valid unit layout, and whether some were invalid (pass 2 reports
    those: one problem, one diagnostic); duplicates go to ``out``."""
    layouts, some_invalid = [], False
    for unit in present:
        lst = _get(units, unit, "supported_layouts")
        if isinstance(lst, list):
            out.extend(_duplicates(doc, ("compute_units", unit, "supported_layouts"), lst, "{} is listed twice",
                                   keep=_valid_layout))
            for i, layout in enumerate(lst):
                if not _valid_layout(layout):
                    some_invalid = True
                    continue
                layouts.append(((("compute_units", unit, "supported_layouts", i)), layout))
    return layouts, some_invalid


def _layouts(doc: LocatedDocument, data: dict, units: dict, present: list[str]) -> list[Diagnostic]:
    """Layouts within max_rank, the default among the units' layouts, all over the same letters."""
    out: list[Diagnostic] = []
    layouts, some_invalid = _listed_layouts(doc, units, present, out)
    max_rank = _get(data, "tensor", "max_rank")
    default = _get(data, "tensor", "default_layout")
    if not _valid_layout(default):
        default = None
    else:
        layouts.append((("tensor", "default_layout"), default))
    if _is_int(max_rank) and 1 <= max_rank <= 16:
        for path, layout in layouts:
            if len(layout) > max_rank:
                out.append(doc.diagnostic(path, f"layout {layout} has rank {len(layout)}, above tensor.max_rank "
                                                f"{max_rank}; lower the layout's rank or raise max_rank"))
    listed = {layout for path, layout in layouts if path[0] == "compute_units"}
    if default and listed and not some_invalid and default not in listed:
        out.append(doc.diagnostic(("tensor", "default_layout"),
                                  f"default layout {default} is not among the supported layouts "
                                  f"[{', '.join(sorted(listed))}]; add it to a unit's supported_layouts "
                                  "or choose one of those"))
    if len(layouts) > 1 and default:
        for path, layout in layouts:
            if len(layout) == len(default) and set(layout) != set(default):
                out.append(doc.diagnostic(path, f"layout {layout} uses other dimension letters than the default "
                                                f"layout {default}; a layout is a permutation of the same "
                                                "logical dimensions"))
    return out


def _attention(doc: LocatedDocument, data: dict, units: dict) -> list[Diagnostic]:
    """An enabled attention unit states its limits, within the chip's; head counts unique."""
    att = _get(units, "attention")
    if not isinstance(att, dict):
        return []
    out = []
    seq = att.get("max_sequence_length")
    chip_seq = _get(data, "constraints", "max_sequence_length")
    if att.get("enabled") is True:
        for name in ("max_sequence_length", "supported_heads"):
            if att.get(name) is None:  # absent, or null: the unit's limits are unknown either way
                written = " (null is not a value here)" if name in att else ""
                out.append(doc.diagnostic(("compute_units", "attention", name),
                                          f"an enabled attention unit must state {name}{written}; add it"))
    if _is_int(seq) and _is_int(chip_seq) and seq > chip_seq:
        out.append(doc.diagnostic(("compute_units", "attention", "max_sequence_length"),
                                  f"the attention unit's max_sequence_length {seq} exceeds the chip's "
                                  f"constraints.max_sequence_length {chip_seq}; lower it to at most {chip_seq}"))
    heads = att.get("supported_heads")
    if isinstance(heads, list):  # type and range: pass 2 (one problem, one diagnostic)
        out.extend(_duplicates(doc, ("compute_units", "attention", "supported_heads"), heads,
                               "head count {} is listed twice", keep=_is_int))
    return out


def _execution(doc: LocatedDocument, ex) -> list[Diagnostic]:
    """Format 1.1's parallel grain: waves need both the tile count at once and the tile size."""
    if not isinstance(ex, dict):
        return []
    out = []
    if not ex:
        out.append(doc.diagnostic(("execution",), "the execution section is empty; give launch_overhead_us, "
                                                  "concurrent_tiles and tile_elements or remove it", "warning",
                                  key=True))
    if "tile_elements" in ex and "concurrent_tiles" not in ex:
        out.append(doc.diagnostic(("execution", "tile_elements"),
                                  "tile_elements needs execution.concurrent_tiles (how many such tiles run at "
                                  "once, e.g. the SM count); add it or remove tile_elements", key=True))
    if "concurrent_tiles" in ex and "tile_elements" not in ex:
        out.append(doc.diagnostic(("execution", "concurrent_tiles"),
                                  "concurrent_tiles without execution.tile_elements: waves are not modelled; "
                                  "add tile_elements (output elements per tile, e.g. 16384 for 128 x 128)",
                                  "warning", key=True))
    return out


def _duplicates(doc: LocatedDocument, path: tuple, items, what: str, keep=lambda v: isinstance(v, str)):
    """One diagnostic per repeated item of a list (those ``keep`` accepts), in one pass."""
    if not isinstance(items, list):
        return []
    first: dict = {}
    out = []
    for i, item in enumerate(items):
        if not keep(item):
            continue
        if item in first:
            out.append(doc.diagnostic(path + (i,), f"{what.format(item)} (first at item {first[item]}); "
                                                   "remove the duplicate"))
        else:
            first[item] = i
    return out


def _valid_layout(value) -> bool:
    return isinstance(value, str) and bool(LAYOUT.fullmatch(value)) and len(set(value)) == len(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
