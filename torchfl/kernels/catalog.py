"""The kernel catalog: every family subpackage's ``KERNELS``, found with pkgutil.

Importing this module imports the families' pure-Python parts only (never numba or
torch), so rules and the planner can read names, inputs, attrs and tiling cheaply.
A new family is a new subpackage with ``KERNELS``; nothing here changes.
"""
from __future__ import annotations

import importlib
import pkgutil

import torchfl.kernels as _pkg

from .spec import KernelSpec, Problem, TensorMeta  # noqa: F401  (re-exported)

__all__ = ["CATALOG", "KernelSpec", "Problem", "TensorMeta", "get", "families"]


def _discover() -> dict:
    found: dict[str, KernelSpec] = {}
    for info in sorted(pkgutil.iter_modules(_pkg.__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        mod = importlib.import_module(f"torchfl.kernels.{info.name}")
        for spec in getattr(mod, "KERNELS", ()):
            if spec.name in found:
                raise RuntimeError(f"kernel name {spec.name!r} defined twice "
                                   f"({found[spec.name].family} and {spec.family})")
            found[spec.name] = spec
    return found


CATALOG: dict = _discover()


def families() -> tuple:
    return tuple(sorted({s.family for s in CATALOG.values()}))


def get(name: str) -> KernelSpec:
    """The spec called ``name``; the error lists close names."""
    try:
        return CATALOG[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, CATALOG, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"no kernel named {name!r} in the catalog{hint}") from None
