"""``--system NAME|FILE``: a system descriptor (torchfl/hcd/system.py) resolved to what a
multi-chip plan reads, the same as ``--chips NxCHIP`` gives it: a chip count and a Target whose
HCD carries the system's interconnect (the chip's links with the system's fabric, domain size
and overrides; the system's numbers win)."""

from __future__ import annotations

import dataclasses

from torchfl.planner.parallel.split import ParallelError


@dataclasses.dataclass(frozen=True)
class SystemTarget:
    """A system ready to plan on: ``target`` (its chip, links from the system), ``count`` chips."""

    system: object      # torchfl.hcd.system.System
    target: object      # torchfl.planner.target.Target
    count: int

    @property
    def label(self) -> str:
        """What a what-if answer's first line names: ``system HGX-H100-8 1.0.0: 8x H100-SXM5-80GB 1.3.0,
        all-to-all`` (the chip version resolved; the fabric follows in the answer)."""
        s, hcd = self.system, self.target.hcd
        nodes = f", {s.domains} domains of {s.topology.domain_chips}" if s.domains > 1 else ""
        return f"system {s.name} {s.version}: {self.count}x {hcd.chip.name} {hcd.chip.version}, {s.topology.kind}{nodes}"


def system_target(spec: str, registry=None) -> SystemTarget:
    """Resolve ``spec`` (a ``*.system.yaml`` file, or a published system ``NAME[@VERSION]``) against
    ``registry`` (a Registry, a URL or None). Raises ParallelError (one line) when the file is bad
    or the system's links cannot be priced, NotFound (did-you-mean) for an unknown name."""
    from torchfl.planner import whatif
    from torchfl.registry.api import open_registry
    from torchfl.registry.systems import load_system_spec

    from torchfl.hcd import TorchflInputError
    from torchfl.hcd.diagnostics import errors

    reg = open_registry(registry)
    try:
        system = load_system_spec(reg, spec)
    except TorchflInputError as exc:
        bad = errors(exc.diagnostics) or exc.diagnostics
        more = f" (and {len(bad) - 1} more: run torchfl system validate {spec})" if len(bad) > 1 else ""
        raise ParallelError(f"--system {spec}: {bad[0]}{more}" if bad else f"--system {spec}: {exc}") from None
    except OSError as exc:
        raise ParallelError(f"--system {spec}: cannot be read ({exc.strerror or exc}); check the path") from None
    if system.domains > 1:
        raise ParallelError(f"system {system.name} has {system.domains} fabric domains of {system.topology.domain_chips} "
                            "chips: plans across domains (scale-out links) are not built yet; plan one domain "
                            f"(--chips {system.topology.domain_chips}x{system.chips.name})")
    target = whatif.chip_of(system.chips.name, reg, version=system.chips.version)
    try:
        ic = system.interconnect_for(target.hcd)
    except ValueError as exc:
        raise ParallelError(str(exc)) from None
    hcd = target.hcd.model_copy(update={"interconnect": ic})
    return SystemTarget(system, dataclasses.replace(target, hcd=hcd), system.chips.count)
