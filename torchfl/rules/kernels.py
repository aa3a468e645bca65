"""Which kernel names a rule may use, and what each takes: the kernel catalog's contract.

The catalog (:mod:`torchfl.kernels.catalog`, pure Python, no numba or torch) is
authoritative for names, inputs, attrs and dtypes.
"""

from __future__ import annotations

from functools import lru_cache


def catalog() -> dict:
    """name -> KernelSpec."""
    from torchfl.kernels.catalog import CATALOG

    return CATALOG


@lru_cache(maxsize=1)
def kernel_names() -> dict[str, str]:
    """name -> family."""
    return {n: s.family for n, s in catalog().items()}


def spec(name: str):
    """The KernelSpec, or None for a name that is no kernel."""
    return catalog().get(name)


def kernel_dtypes(name: str) -> tuple[str, ...] | None:
    s = spec(name)
    return tuple(s.dtypes) if s is not None else None


def kernel_params(name: str) -> tuple[set[str], set[str]] | None:
    """(input names, attr names) of a kernel, or None when unknown."""
    s = spec(name)
    if s is None:
        return None
    return {n.rstrip("?") for n in s.inputs}, set(s.attrs)
