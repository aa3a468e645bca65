"""Installs the Mamba scan routing (``torchfl.kernels.ssm.hf_route``, whose docstring says why)
in both modes: a ``sys.meta_path`` finder for the routed transformers modules, set up with the
``npu`` device at ``import torch``, patches each right after it executes (the eager device's
calls); the compile backend's import calls :func:`for_compile`. Kept apart from ``hf_route`` so
that ``import torch`` loads nothing of torchfl's kernels: the finder compares one name per import.
"""
from __future__ import annotations

import importlib.abc
import sys

#: torchfl.kernels.ssm.hf_route.MODULES, spelt here so the finder needs no import of the kernels
MODULES = ("transformers.models.mamba.modeling_mamba", "transformers.models.falcon_mamba.modeling_falcon_mamba")


def for_compile() -> None:
    """The torchfl compile backend is in use in this process: route its traces too."""
    from torchfl.kernels.ssm.hf_route import for_compile as route_compiles

    route_compiles()
    install()


class _Finder(importlib.abc.MetaPathFinder):
    """Patches a routed module right after it executes; every other import passes through."""

    def find_spec(self, name, path, target=None):
        if name not in MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                class Loader(importlib.abc.Loader):
                    def create_module(self, spec_):
                        return None

                    def exec_module(self, module):
                        run(module)
                        from torchfl.kernels.ssm.hf_route import patch

                        patch(module)

                spec.loader = Loader()
                return spec
        return None


_FINDER = _Finder()


def install() -> None:
    """Patch the routed modules already imported now, the others when they are (idempotent)."""
    if any(name in sys.modules for name in MODULES):
        from torchfl.kernels.ssm.hf_route import patch_imported

        patch_imported()
    if _FINDER not in sys.meta_path and not all(name in sys.modules for name in MODULES):
        sys.meta_path.insert(0, _FINDER)
