"""System descriptors (``*.system.yaml``): N chips of one HCD, their topology and host links.

An HCD describes one chip, with its links to peers in an optional ``interconnect:`` section. A
*system* names how many of which chip are wired together and how: the fabric domain (NVSwitch
all-to-all, a ring, a 2D torus) and how many chips it holds, the host link of each chip (PCIe
generation and lanes), and per-system overrides of the chip's link numbers (a 4-chip board
wired slower than the chip's datasheet, or a chip whose HCD states no links at all). Every
override and host number names its source in the HCD format 1.2 way (``sources:`` /
``provenance:``, :mod:`torchfl.hcd.provenance`, the same checks and the same warnings).

The file is read by the hcd package's one YAML loader and checked like an HCD: every problem at
once, located at file:line:col, unknown keys with did-you-mean. Whether the named chip exists is
a question for a registry: :func:`check_system_text` answers it when given a ``catalog`` (chip
name -> {version: whether that version's HCD states an interconnect}).

The planner reads a system through :meth:`System.interconnect_for`: the chip's ``interconnect``
with the system's fabric, domain and overrides applied (the system wins).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Mapping, Optional

from pydantic import AfterValidator, Field, PrivateAttr, ValidationError, WithJsonSchema

from torchfl.hcd.diagnostics import Diagnostic, FileReport, HCDError, YAMLLoadError, errors
from torchfl.hcd.model import (CHIP_NAME, FABRICS, SUSTAINED_MIN, SUSTAINED_UNIT, Interconnect, _chip_name, _fabric,
                               _Model, _semver)
from torchfl.hcd.provenance import MAX_SOURCES, ProvenanceView, Source, check_provenance
from torchfl.hcd.source import LocatedDocument, located_yaml, read_source

#: the file name ending a system descriptor has (``torchfl registry import`` also reads any
#: ``*.yaml`` whose top level has ``system:``)
SUFFIX = ".system.yaml"

#: how the chips of one fabric domain are wired
TOPOLOGIES = ("all-to-all", "ring", "torus-2d", "torus-3d", "mesh-2d")
_DIMS = {"torus-2d": 2, "torus-3d": 3, "mesh-2d": 2}

#: PCIe bandwidth per lane per direction, GB/s, after line coding (PCI-SIG base specifications
#: 1.0 to 6.0: 2.5/5 GT/s 8b/10b, 8/16/32 GT/s 128b/130b, 64 GT/s PAM4 FLIT)
PCIE_LANE_GB_PER_S = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

#: the numbers of a system file that price something (besides ``interconnect.*``, which are
#: :data:`~torchfl.hcd.provenance.PERFORMANCE_FIELDS` already): each should name its source
SYSTEM_NUMBERS = ("interconnect.links.count", "interconnect.links.bandwidth_gb_per_s",
                  "interconnect.sustained_fraction", "interconnect.latency_us",
                  "interconnect.collective_overhead_us", "host.bandwidth_gb_per_s")


def _topology(value: str) -> str:
    if value not in TOPOLOGIES:
        close = difflib.get_close_matches(value, TOPOLOGIES, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise ValueError(f"unknown topology {value!r}{hint} Write one of: {', '.join(TOPOLOGIES)}")
    return value


_Name = Annotated[str, AfterValidator(_chip_name), WithJsonSchema({"type": "string", "pattern": CHIP_NAME.pattern})]
_Version = Annotated[str, AfterValidator(_semver)]


class SystemInfo(_Model):
    """Identity of the system and of this descriptor (versioned in the registry like a chip)."""

    name: _Name = Field(description="Unique system identifier, e.g. HGX-H100-8 (what --system NAME takes).")
    version: _Version = Field(description="Version of this descriptor, MAJOR.MINOR.PATCH.")
    vendor: Optional[str] = Field(default=None, min_length=1, max_length=200, description="Who builds it.")
    description: Optional[str] = Field(default=None, min_length=1, max_length=2000,
                                       description="One line: the product (e.g. HGX H100 8-GPU baseboard).")


class ChipSet(_Model):
    """Which chip, how many."""

    name: _Name = Field(description="The chip's HCD name in the registry, e.g. H100-SXM5-80GB.")
    version: Optional[_Version] = Field(default=None, description="A published version of that HCD; absent: "
                                                                  "the registry's latest.")
    count: int = Field(ge=2, le=1 << 20, description="Chips in the system (integer, at least 2).")


class Topology(_Model):
    """How the chips of one fabric domain are wired, and how many a domain holds."""

    kind: Annotated[str, AfterValidator(_topology), WithJsonSchema({"type": "string", "enum": list(TOPOLOGIES)})] = \
        Field(description="all-to-all (a switch or direct links to every peer) | ring | torus-2d | torus-3d | mesh-2d.")
    fabric: Optional[Annotated[str, AfterValidator(_fabric), WithJsonSchema({"type": "string",
                                                                              "enum": list(FABRICS)})]] = Field(
        default=None, description="The link technology; absent: the chip HCD's interconnect.fabric.")
    domain_chips: int = Field(ge=2, le=1 << 20, description="Chips one fabric domain connects (a node, a board); "
                                                            "it divides chips.count.")
    dims: Optional[list[Annotated[int, Field(ge=1, le=1 << 12)]]] = Field(
        default=None, min_length=2, max_length=3,
        description="Torus or mesh extents (2 or 3 integers) whose product is domain_chips.")


class HostLinks(_Model):
    """Each chip's link to its host CPU."""

    pcie_gen: int = Field(ge=1, le=6, description="PCIe generation (1 to 6).")
    lanes: int = Field(ge=1, le=32, description="PCIe lanes per chip (1, 2, 4, 8, 16 or 32).")
    bandwidth_gb_per_s: Optional[float] = Field(
        default=None, ge=1e-3, le=10_000,
        description="Sustained host-link bandwidth per chip in ONE direction, GB/s; absent: lanes x the "
                    "generation's line rate.")

    @property
    def gb_per_s(self) -> float:
        """The stated bandwidth, else lanes x the PCIe generation's per-lane rate (one direction)."""
        if self.bandwidth_gb_per_s is not None:
            return float(self.bandwidth_gb_per_s)
        return self.lanes * PCIE_LANE_GB_PER_S[self.pcie_gen]


class LinkOverrides(_Model):
    count: Optional[int] = Field(default=None, ge=1, le=1024, description="Links per chip to its peers.")
    bandwidth_gb_per_s: Optional[float] = Field(default=None, ge=1e-3, le=100_000,
                                                description="One link's bandwidth in ONE direction, GB/s.")


class InterconnectOverrides(_Model):
    """The chip HCD's ``interconnect`` numbers this system changes (or states, for a chip whose HCD
    has none): the same names, each optional. Fabric and domain come from ``topology``."""

    links: Optional[LinkOverrides] = None
    sustained_fraction: Optional[float] = Field(default=None, ge=SUSTAINED_MIN, le=1,
                                                description="Share of the line rate a ring all-reduce sustains. "
                                                            + SUSTAINED_UNIT)
    latency_us: Optional[float] = Field(default=None, ge=0, le=1_000_000,
                                        description="Latency of one ring step, microseconds.")
    collective_overhead_us: Optional[float] = Field(default=None, ge=0, le=1_000_000,
                                                    description="Fixed cost of one collective call, microseconds.")


class System(ProvenanceView, _Model):
    """A system descriptor: ``system`` (identity), ``chips`` (which, how many), ``topology``,
    optional ``host`` links and ``interconnect`` overrides, with ``sources``/``provenance``."""

    system: SystemInfo
    chips: ChipSet
    topology: Topology
    host: Optional[HostLinks] = Field(default=None, description="Each chip's host link (optional).")
    interconnect: Optional[InterconnectOverrides] = Field(
        default=None, description="Overrides of the chip HCD's interconnect numbers (the system's win).")
    sources: dict[str, Source] = Field(default_factory=dict, max_length=MAX_SOURCES,
                                       description="Named references of the numbers (as in an HCD, format 1.2).")
    provenance: dict[str, str] = Field(default_factory=dict, max_length=256,
                                       description="Dotted path of a number -> source id.")

    _warnings: tuple = PrivateAttr(default=())

    @property
    def warnings(self) -> tuple:
        return self._warnings

    @property
    def name(self) -> str:
        return self.system.name

    @property
    def version(self) -> str:
        return self.system.version

    @property
    def domains(self) -> int:
        """Fabric domains (nodes) in the system."""
        return self.chips.count // self.topology.domain_chips

    def describe(self) -> str:
        """One clause: ``HGX-H100-8 1.0.0: 8x H100-SXM5-80GB, nvswitch all-to-all``."""
        fabric = f"{self.topology.fabric} " if self.topology.fabric else ""
        nodes = f", {self.domains} domains of {self.topology.domain_chips}" if self.domains > 1 else ""
        return (f"system {self.name} {self.version}: {self.chips.count}x {self.chips.name}"
                f"{' ' + self.chips.version if self.chips.version else ''}, {fabric}{self.topology.kind}{nodes}")

    def interconnect_for(self, hcd) -> Interconnect:
        """The links the planner prices for this system of ``hcd`` chips: the HCD's ``interconnect``
        with this system's fabric, domain size and overrides (the system wins). Raises ValueError
        (one line, what to add) when neither states a number the planner needs."""
        base = hcd.interconnect.model_dump(exclude_none=True) if hcd.interconnect is not None else {}
        over = self.interconnect.model_dump(exclude_none=True) if self.interconnect is not None else {}
        links = {**base.get("links", {}), **over.pop("links", {})}
        merged = {**base, **over, "links": links, "domain_chips": self.topology.domain_chips}
        if self.topology.fabric:
            merged["fabric"] = self.topology.fabric
        missing = [p for p, ok in (("topology.fabric", "fabric" in merged),
                                   ("interconnect.links.count", "count" in links),
                                   ("interconnect.links.bandwidth_gb_per_s", "bandwidth_gb_per_s" in links)) if not ok]
        if missing:
            raise ValueError(f"system {self.name}: chip {hcd.chip.name} {hcd.chip.version} states no interconnect, so "
                             f"the system file must give {', '.join(missing)} (with their sources)")
        return Interconnect.model_validate(merged)

    def link_numbers(self, hcd) -> dict[str, tuple[float, str, str]]:
        """Each link number the planner prices for this system -> (value, ``"system"`` or
        ``"chip"``: whose file states it, the kind of its source): the audit trail of a plan."""
        ic = self.interconnect_for(hcd)
        out = {}
        for path in SYSTEM_NUMBERS:
            if not path.startswith("interconnect."):
                continue
            keys = path.split(".")[1:]
            value, mine = ic, self.interconnect
            for k in keys:
                value = getattr(value, k, None)
                mine = getattr(mine, k, None) if mine is not None else None
            if value is None:
                continue
            if mine is not None:
                out[path] = (float(value), "system", self.kind_of(path))
            else:
                out[path] = (float(value), "chip", hcd.kind_of(path))
        return out



class SystemDescriptorError(HCDError):
    """A system descriptor failed validation; ``.diagnostics`` lists every problem."""


#: chip name -> {published version: whether its HCD states an ``interconnect``}, versions oldest
#: first by semver (the last is the latest)
Catalog = Mapping[str, Mapping[str, bool]]


@dataclass
class SystemReport(FileReport):
    """Outcome of checking one system file. ``system`` is set only when there is no error."""

    system: System | None = None


def check_system(path: str | Path, catalog: Catalog | None = None) -> SystemReport:
    """Read and validate one system file (against ``catalog`` when given). Never raises for bad input."""
    text, diagnostics, readable = read_source(path, "a system descriptor")
    if text is None:
        return SystemReport(str(path), diagnostics=diagnostics, readable=readable)
    return check_system_text(text, str(path), catalog)


def check_system_text(text: str, filename: str = "<string>", catalog: Catalog | None = None) -> SystemReport:
    """Validate system source text: structure, topology against count, provenance, and (with a
    ``catalog``) that the chip and version exist and that its links are stated somewhere."""
    from torchfl.hcd.validate import _structure_diagnostics

    report = SystemReport(filename, source=text)
    try:
        doc = located_yaml(text, filename, keep_going=True)
    except YAMLLoadError as exc:
        report.diagnostics = list(exc.diagnostics)
        return report
    data = doc.data
    if not isinstance(data, dict):
        report.diagnostics = [doc.diagnostic((), f"the document is a {type(data).__name__}; a system descriptor is a "
                                                 "mapping with sections system, chips and topology")]
        return report
    out: list[Diagnostic] = []
    system = None
    try:
        system = System.model_validate(data)
    except ValidationError as exc:
        out.extend(_structure_diagnostics(doc, exc, System))
    out.extend(_topology_rules(doc, data))
    out.extend(check_provenance(doc, data))
    out.extend(_unsourced(doc, data, out))
    if catalog is not None:
        out.extend(_against_catalog(doc, data, catalog))
    out = sorted([d for d in out if not doc.is_refused(d.path)] + doc.problems)
    report.diagnostics = out
    if system is not None and not errors(out):
        system._warnings = tuple(out)
        report.system = system
    return report


def load_system(path: str | Path, catalog: Catalog | None = None) -> System:
    """A valid system, or :class:`SystemDescriptorError` listing every problem."""
    report = check_system(path, catalog)
    if not report.ok or report.system is None:
        raise SystemDescriptorError(report.diagnostics)
    return report.system


def load_system_text(text: str, filename: str = "<string>", catalog: Catalog | None = None) -> System:
    report = check_system_text(text, filename, catalog)
    if not report.ok or report.system is None:
        raise SystemDescriptorError(report.diagnostics)
    return report.system


def system_json_schema() -> dict:
    """JSON Schema (draft 2020-12) of the system format, for editors and yaml-language-server."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://torchfl.dev/schema/system-v1.json",
            **System.model_json_schema(mode="validation"),
            "title": "torchfl system descriptor (N chips of one HCD, topology, host links, link overrides)"}


def is_system_data(data: object) -> bool:
    """Whether a parsed YAML top level is a system descriptor (the registry's dispatch)."""
    return isinstance(data, dict) and "system" in data and "chips" in data


# --------------------------------------------------------------------------- located rules


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _topology_rules(doc: LocatedDocument, data: dict) -> list[Diagnostic]:
    """The topology against the chip count: domains divide it, a torus's extents multiply to a domain."""
    out: list[Diagnostic] = []
    chips = data.get("chips") if isinstance(data.get("chips"), dict) else {}
    topo = data.get("topology") if isinstance(data.get("topology"), dict) else {}
    count, domain = _int(chips.get("count")), _int(topo.get("domain_chips"))
    kind, dims = topo.get("kind"), topo.get("dims")
    if count and domain and count >= 2 and domain >= 2 and count % domain:
        fits = [d for d in range(2, count + 1) if count % d == 0][-3:]
        out.append(doc.diagnostic(("topology", "domain_chips"),
                                  f"{count} chips (chips.count) do not fill fabric domains of {domain}: "
                                  f"domain_chips must divide the count, e.g. {' or '.join(map(str, fits))}"))
    if kind in _DIMS:
        want = _DIMS[kind]
        if dims is None:
            out.append(doc.diagnostic(("topology", "kind"), f"a {kind} states its extents: add dims: "
                                                            f"[{', '.join(['N'] * want)}] (their product is "
                                                            "domain_chips)"))
        elif isinstance(dims, list) and all(_int(d) for d in dims):
            product = 1
            for d in dims:
                product *= d
            if len(dims) != want:
                out.append(doc.diagnostic(("topology", "dims"), f"a {kind} has {want} extents, got {len(dims)}"))
            elif domain and product != domain:
                out.append(doc.diagnostic(("topology", "dims"),
                                          f"{kind} extents {'x'.join(map(str, dims))} = {product} chips, but "
                                          f"domain_chips is {domain}; make the product equal domain_chips"))
    elif kind in TOPOLOGIES and dims is not None:
        out.append(doc.diagnostic(("topology", "dims"), f"dims go with a torus or mesh, not {kind}; remove them",
                                  key=True))
    return out


def _unsourced(doc: LocatedDocument, data: dict, found: list[Diagnostic]) -> list[Diagnostic]:
    """A link or host number without provenance is a warning even in a file with no ``sources:``
    (check_provenance speaks only when the sections exist): a system's numbers are its claims."""
    prov = data.get("provenance") if isinstance(data.get("provenance"), dict) else {}
    said = {d.path for d in found}
    out = []
    for path in SYSTEM_NUMBERS:
        keys = tuple(path.split("."))
        node = data
        for k in keys:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool) and path not in prov and path not in said:
            out.append(doc.diagnostic(keys, f"no provenance: add the line '{path}: <source id>' under provenance: "
                                            "(and the source under sources:)", "warning", key=True))
    return out


def _against_catalog(doc: LocatedDocument, data: dict, catalog: Catalog) -> list[Diagnostic]:
    """The chip (and version) must be in the registry; a chip whose HCD states no interconnect
    needs the system to state its links."""
    chips = data.get("chips") if isinstance(data.get("chips"), dict) else {}
    name, version = chips.get("name"), chips.get("version")
    if not isinstance(name, str):
        return []
    if name not in catalog:
        close = difflib.get_close_matches(name, list(catalog), n=1, cutoff=0.5)
        close += [n for n in catalog if n.lower() == name.lower() and n not in close]
        hint = f"; did you mean {close[0]!r}?" if close else "."
        return [doc.diagnostic(("chips", "name"), f"unknown chip {name!r}{hint} Import its HCD first "
                                                   "(torchfl registry import FILE.hcd) or name a published chip")]
    versions = catalog[name]
    if isinstance(version, str) and version not in versions:
        known = ", ".join(sorted(versions))
        return [doc.diagnostic(("chips", "version"), f"chip {name} has no version {version} (published: {known}); "
                                                      "name one of those or leave version out for the latest")]
    if not isinstance(version, str):
        version = list(versions)[-1]  # the catalog lists versions oldest first (semver)
    if versions.get(version):
        return []
    topo = data.get("topology") if isinstance(data.get("topology"), dict) else {}
    over = data.get("interconnect") if isinstance(data.get("interconnect"), dict) else {}
    links = over.get("links") if isinstance(over.get("links"), dict) else {}
    missing = [p for p, ok in (("topology.fabric", "fabric" in topo), ("interconnect.links.count", "count" in links),
                               ("interconnect.links.bandwidth_gb_per_s", "bandwidth_gb_per_s" in links)) if not ok]
    if not missing:
        return []
    return [doc.diagnostic(("chips", "name"), f"chip {name} {version} states no interconnect in its HCD: this system "
                                               f"must give {', '.join(missing)} (each with its source)")]
