"""Turn files into validated documents (chips, rule packs, systems) before anything is written.

Dispatch: ``*.hcd`` is an HCD; ``*.yaml``/``*.yml`` is a rule pack when its top level has
``pack:``, a system descriptor (``*.system.yaml``) when it has ``system:`` and ``chips:``, an
HCD when it has ``chip:``. A system's chip is checked against the registry by the import
(``Registry._store``), which alone knows what the registry holds. Every file is checked and every problem is
collected, so one import reports all of them at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torchfl.hcd.diagnostics import Diagnostic


@dataclass(frozen=True)
class Document:
    """One valid chip or rule pack, ready to store."""

    kind: str  # "chip" | "pack" | "system"
    file: str
    name: str
    version: str
    source: str
    canonical_json: str
    content_hash: str
    extra: dict = field(default_factory=dict)  # chip: vendor, device_type


def _error(file: str, message: str) -> Diagnostic:
    return Diagnostic(file, 1, 1, "", "error", message)


def _from_hcd_report(report, file: str, source: str | None):
    if not report.ok or report.hcd is None:
        return None, report.diagnostics
    hcd = report.hcd
    doc = Document("chip", file, hcd.chip.name, hcd.chip.version, source if source is not None else report.source,
                   hcd.canonical_json(), hcd.content_hash(),
                   {"vendor": hcd.chip.vendor, "device_type": hcd.chip.device_type})
    return doc, report.diagnostics


def _pack_document(path: str, source: str):
    from torchfl.rules import check_pack

    report = check_pack(path)
    if not report.ok or report.pack is None:
        return None, list(report.diagnostics)
    pack = report.pack
    text = report.source if getattr(report, "source", None) is not None else source
    return Document("pack", path, pack.name, pack.version, text, pack.canonical_json(),
                    pack.content_hash()), list(report.diagnostics)


def _system_document(path: str, source: str):
    from torchfl.hcd.system import check_system_text

    report = check_system_text(source, path)
    if not report.ok or report.system is None:
        return None, list(report.diagnostics)
    system = report.system
    return Document("system", path, system.name, system.version, source, system.canonical_json(),
                    system.content_hash(), {"chip_name": system.chips.name, "chip_version": system.chips.version,
                                            "chip_count": system.chips.count}), list(report.diagnostics)


def load_document(path: str | Path):
    """(Document | None, diagnostics) for one file. Never raises for bad input."""
    from torchfl.hcd import YAMLLoadError, check_hcd, check_hcd_text, located_yaml, read_text

    name = str(path)
    suffix = Path(name).suffix.lower()
    if Path(name).is_dir():
        return None, [_error(name, "is a directory with no *.hcd, *.yaml or *.yml file in it: nothing to import; "
                                   "name the files, or the directory that holds them")]
    if suffix == ".hcd":
        report = check_hcd(name)
        return _from_hcd_report(report, name, report.source)
    if suffix not in (".yaml", ".yml"):
        return None, [_error(name, f"unknown kind of file ({suffix or 'no extension'}); an HCD ends in .hcd, "
                                   "a rule pack in .yaml or .yml")]
    try:
        source = read_text(name)  # the same size bound and UTF-8 check as an HCD
    except YAMLLoadError as exc:
        return None, exc.diagnostics
    except FileNotFoundError:
        return None, [_error(name, "no such file; check the path")]
    except IsADirectoryError:
        return None, [_error(name, "is a directory, not a file")]
    except PermissionError:
        return None, [_error(name, "permission denied; make the file readable")]
    except OSError as exc:
        return None, [_error(name, f"cannot be read ({exc.strerror or exc})")]
    try:
        top = located_yaml(source, name).data
    except YAMLLoadError as exc:
        return None, exc.diagnostics
    if isinstance(top, dict) and "pack" in top:
        return _pack_document(name, source)
    from torchfl.hcd.system import is_system_data

    if is_system_data(top) or name.lower().endswith(".system.yaml"):
        return _system_document(name, source)
    if isinstance(top, dict) and "chip" in top:
        return _from_hcd_report(check_hcd_text(source, name), name, source)
    return None, [_error(name, "is neither a rule pack (top-level `pack:`), a system (top-level `system:` and "
                               "`chips:`) nor an HCD (top-level `chip:`)")]


SUFFIXES = (".hcd", ".yaml", ".yml")


def expand_paths(paths) -> list[str]:
    """Files to import: a directory stands for the *.hcd, *.yaml and *.yml files in it.

    A directory holding none stays in the list as itself, so that it is reported
    ("nothing to import") instead of silently adding nothing.
    """
    out: list[str] = []
    for f in paths:
        p = Path(f)
        try:
            found = sorted(str(c) for c in p.iterdir() if c.suffix.lower() in SUFFIXES and c.is_file()) \
                if p.is_dir() else []
        except OSError:  # an unreadable directory: reported by load_document
            found = []
        out += found or [str(f)]
    return out


def load_documents(paths, progress=None) -> tuple[list[Document], list[Diagnostic]]:
    """Validate every file; return the documents and all diagnostics (errors and warnings)."""
    found: list[Document] = []
    out: list[Diagnostic] = []
    paths = list(paths)
    for i, path in enumerate(paths, 1):
        doc, diags = load_document(path)
        if progress:
            progress("validating", i, len(paths))
        out.extend(diags)
        if doc is not None:
            found.append(doc)
    docs, clashes = unique(found)
    return docs, out + clashes


def unique(found) -> tuple[list[Document], list[Diagnostic]]:
    """One document per (kind, name, version) of one import.

    Two that agree are one; two that differ are an error (the registry would otherwise
    have to pick one).
    """
    docs: dict[tuple, Document] = {}
    out: list[Diagnostic] = []
    for doc in found:
        key = (doc.kind, doc.name, doc.version)
        seen = docs.get(key)
        if seen is None:
            docs[key] = doc
        elif seen.content_hash != doc.content_hash:
            out.append(_error(doc.file, f"{doc.kind} {doc.name} {doc.version} is also in {seen.file} with different "
                                        "content; give each a different version"))
    return list(docs.values()), out


def document_from_hcd_text(text: str, filename: str):
    """(Document | None, diagnostics) from HCD source text, for callers holding text, not files."""
    from torchfl.hcd import check_hcd_text

    return _from_hcd_report(check_hcd_text(text, filename), filename, text)
