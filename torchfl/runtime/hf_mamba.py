"""Transformers' Mamba (and FalconMamba) scan routed to torchfl's ``selective_scan`` kernel, in both modes.

Why here and not a graph fusion: without mamba_ssm, transformers runs the scan as a Python
loop over time in eager mode (per step a multiply-add of ``[B, D, N]``, a matmul with ``C``,
and a 16-way ``stack`` at the end) and, under torch.compile, as ``associative_scan`` that
Dynamo unrolls into a tree of slices and vmapped multiply-adds (~140 nodes a layer at
length 16). The two captures share no pattern a fusion could match, and both change with the
length and with transformers' version. The one stable place is the function both paths go
through, ``modeling_mamba.mamba_selective_scan`` (the same contract as mamba_ssm's
``selective_scan_fn``, which is why transformers can swap in the CUDA kernel there). torchfl
swaps in ``torch.ops.torchfl.selective_scan`` the same way, and only:

- for ``npu`` tensors (the eager device), and
- while Dynamo traces in a process that has looked up the ``torchfl`` compile backend
  (``torch.compile(..., backend="torchfl")`` imports ``torchfl.runtime.backend``, which calls
  :func:`for_compile`). Another backend compiling in that same process also gets the operator:
  its CPU body is the reference recurrence in float32 (same numbers, one loop).

Anything else (CPU eager, processes that never use torchfl's backend, and any call that
autograd records: the operator has no backward yet) calls transformers' own function. The
swap is installed when ``modeling_mamba`` is imported (a ``sys.meta_path`` finder for that
one module, set up with the ``npu`` device at ``import torch``), or at once when it is
already imported.
"""
from __future__ import annotations

import importlib.abc
import sys

#: the modules whose ``mamba_selective_scan`` is routed (FalconMamba's is a copy of Mamba's)
MODULES = ("transformers.models.mamba.modeling_mamba", "transformers.models.falcon_mamba.modeling_falcon_mamba")
_COMPILE = [False]       # set by for_compile(): the torchfl backend was looked up in this process


def for_compile() -> None:
    """The torchfl compile backend is in use in this process: route compiled captures too."""
    _COMPILE[0] = True
    install()


def _route(original):
    import torch

    from torchfl.kernels.ssm.torchop import register

    register()
    op = torch.ops.torchfl.selective_scan

    def mamba_selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             return_last_state=False, **kwargs):
        ours = hidden_states.device.type == "npu" or (_COMPILE[0] and torch.compiler.is_compiling())
        if ours and torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (hidden_states, dt, A, B, C, D, z, delta_bias)):
            ours = False       # the operator has no backward: training keeps transformers' differentiable path
        if not ours:
            return original(hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias,
                            delta_softplus=delta_softplus, return_last_state=return_last_state, **kwargs)
        y, last = op(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus)
        return (y, last) if return_last_state else y

    mamba_selective_scan.torchfl_original = original
    mamba_selective_scan.__doc__ = original.__doc__
    return mamba_selective_scan


def _patch(mod) -> None:
    fn = getattr(mod, "mamba_selective_scan", None)
    if fn is None or hasattr(fn, "torchfl_original"):
        return             # a transformers without the function (older: the scan inside the mixer), or done
    mod.mamba_selective_scan = _route(fn)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches ``modeling_mamba`` right after it executes; every other import passes through."""

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
                        _patch(module)

                spec.loader = Loader()
                return spec
        return None


_FINDER = _Finder()


def install() -> None:
    """Patch the modules already imported now, the others when they are (idempotent)."""
    for name in MODULES:
        mod = sys.modules.get(name)
        if mod is not None:
            _patch(mod)
    if _FINDER not in sys.meta_path and not all(name in sys.modules for name in MODULES):
        sys.meta_path.insert(0, _FINDER)
