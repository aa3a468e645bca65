"""Transformers' Mamba (and FalconMamba) scan routed to torchfl's ``selective_scan`` kernel.

Why a capture-time replacement and not a graph fusion: without mamba_ssm, transformers runs the
scan as a Python loop over time in eager mode (per step a multiply-add of ``[B, D, N]``, a matmul
with ``C``, and an L-way ``stack`` at the end), under torch.export as the same loop unrolled, and
under torch.compile as ``associative_scan``, which Dynamo unrolls into a tree of slices and
vmapped multiply-adds (~110 nodes a layer at length 16). The captures share no pattern a fusion
could match, and all change with the length and with transformers' version. The one stable place
is the function every path goes through, ``mamba_selective_scan`` (the same contract as
mamba_ssm's ``selective_scan_fn``, which is why transformers can swap in the CUDA kernel there).
torchfl swaps in ``torch.ops.torchfl.selective_scan`` the same way, and routes a call to it only:

- for ``npu`` tensors (the eager device; ``torchfl.runtime.hf_mamba`` patches the module when it
  is imported), or
- while torch traces for torchfl: inside the planner's own capture (:func:`capturing`, around
  torch.export), or in a process that has looked up the ``torchfl`` compile backend
  (:func:`for_compile`; another backend compiling in that same process then also gets the
  operator, whose CPU body is the reference recurrence in float32: the same numbers).

Anything else (CPU eager, processes that never use torchfl, and any call autograd records: the
operator has no backward yet) calls transformers' own function.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

#: the modules whose ``mamba_selective_scan`` is routed (FalconMamba's is a copy of Mamba's)
MODULES = ("transformers.models.mamba.modeling_mamba", "transformers.models.falcon_mamba.modeling_falcon_mamba")
_TRACING = [0, False]     # [captures in progress, torchfl's compile backend looked up in this process]


def for_compile() -> None:
    """The torchfl compile backend is in use in this process: route its traces too."""
    _TRACING[1] = True
    patch_imported()


@contextmanager
def capturing():
    """Route the scan while the planner captures a module (torch.export traces the Python)."""
    patch_imported()
    _TRACING[0] += 1
    try:
        yield
    finally:
        _TRACING[0] -= 1


def patch_imported() -> None:
    """Patch the routed modules already imported (idempotent)."""
    for name in MODULES:
        mod = sys.modules.get(name)
        if mod is not None:
            patch(mod)


def patch(mod) -> None:
    """Replace ``mod.mamba_selective_scan`` by the routing wrapper (once; a module without it is left alone)."""
    fn = getattr(mod, "mamba_selective_scan", None)
    if fn is None or hasattr(fn, "torchfl_original"):
        return
    mod.mamba_selective_scan = _route(fn)


def _route(original):
    import torch

    from .torchop import register

    register()
    op = torch.ops.torchfl.selective_scan

    def mamba_selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             return_last_state=False, **kwargs):
        captured = _TRACING[0] > 0 and torch.compiler.is_compiling()    # the planner's inference capture
        ours = captured or hidden_states.device.type == "npu" or (_TRACING[1] and torch.compiler.is_compiling())
        if ours and not captured and torch.is_grad_enabled() and any(
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
