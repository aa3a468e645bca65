"""Same code everywhere: what a worker runs, compared with what the driver runs.

A sweep's results are only comparable when every node runs the same torchfl: the same
version and source (its ``.py`` files), the same bundled rule packs, the same torch and
Numba (torch's OpInfo samples and numerics; the compiled kernels). The driver computes its
:class:`Fingerprint` once and sends it with every unit; a worker whose own differs refuses
the unit and names what differs and where (:class:`VersionMismatch`).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from torchfl.cluster import ClusterError


class VersionMismatch(ClusterError):
    """A worker runs another torchfl (or rule packs, torch, Numba) than the driver."""


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


@dataclass(frozen=True)
class Fingerprint:
    torchfl: str          # torchfl.version.__version__
    source: str           # sha256 over torchfl's .py files (relative path and bytes)
    packs: tuple          # ((rule pack file, sha256 of its bytes), ...) bundled with torchfl
    torch: str
    numba: str

    def differences(self, driver: "Fingerprint") -> list[str]:
        """What differs from the driver's, one phrase each ("torchfl 0.2.0, the driver 0.1.0")."""
        out = []
        if self.torchfl != driver.torchfl:
            out.append(f"torchfl {self.torchfl}, the driver {driver.torchfl}")
        elif self.source != driver.source:
            out.append(f"torchfl {self.torchfl} from other sources (sha256:{self.source[:12]}, "
                       f"the driver sha256:{driver.source[:12]})")
        mine, theirs = dict(self.packs), dict(driver.packs)
        for name in sorted(set(mine) | set(theirs)):
            if name not in mine:
                out.append(f"rule pack {name} missing (the driver has sha256:{theirs[name][:12]})")
            elif name not in theirs:
                out.append(f"rule pack {name} sha256:{mine[name][:12]}, which the driver lacks")
            elif mine[name] != theirs[name]:
                out.append(f"rule pack {name} sha256:{mine[name][:12]}, the driver sha256:{theirs[name][:12]}")
        for what in ("torch", "numba"):
            if getattr(self, what) != getattr(driver, what):
                out.append(f"{what} {getattr(self, what)}, the driver {getattr(driver, what)}")
        return out


@functools.lru_cache(maxsize=1)
def local() -> Fingerprint:
    """This process's fingerprint (computed once: ~170 files hashed in a few ms)."""
    from torchfl import version
    from torchfl.resources import bundled_rule_packs

    root = Path(version.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "_bundled" in path.parts:
            continue
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    packs = tuple((p.name, hashlib.sha256(p.read_bytes()).hexdigest()) for p in bundled_rule_packs())
    return Fingerprint(version.__version__, h.hexdigest(), packs, _dist_version("torch"), _dist_version("numba"))


def check(driver: Fingerprint, where: str) -> None:
    """Raise :class:`VersionMismatch` naming ``where`` when this process is not the driver's torchfl."""
    diffs = local().differences(driver)
    if diffs:
        raise VersionMismatch(
            f"worker {where} refused the sweep: it runs {'; '.join(diffs)}; install the driver's torchfl "
            "(same version and sources, same torch and Numba) on every node and restart its Ray worker "
            "(`ray stop`, then `ray start --address HEAD:PORT`)")
