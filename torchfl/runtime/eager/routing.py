"""Where ops on ``npu`` tensors go: the PrivateUse1 fallback (Python), installed at
registration without importing the planner or numba (they load on the first op).

The adapter's C++ kernels (factories, copies, views) take precedence over the fallback;
everything else reaches :func:`torchfl.runtime.eager.dispatch.dispatch`. Structured ops reach a
backend fallback as their ``.out`` overloads, so once the planner is loaded the functional
overloads the rule packs name are registered explicitly too (:func:`register_functional`):
with the adapter loaded, as its C++ fast kernel (``adapter.cpp``, ``FastKernel``: a signature
seen before runs its route's bound kernel without this router; a miss comes back through
:func:`_fast_miss`), else as a Python kernel.
"""
from __future__ import annotations

__all__ = ["install", "install_first_use", "register_functional"]

_LIBS: list = []
_FUNCTIONAL_DONE: set = set()
_CONV: list = [None]    # the Library of convolution_overrideable's Python kernel


# [the dispatcher once loaded, the function that loads it, the fast path's miss handler once
# loaded, the function that loads it]: set by install(); routing imports nothing of the eager
# device (it sits below the dispatcher, which imports the planner)
_DISPATCH: list = [None, None, None, None]


def _load_dispatch():
    _DISPATCH[0] = dispatch = _DISPATCH[1]()
    return dispatch


def _fallback(op, *args, **kwargs):
    return (_DISPATCH[0] or _load_dispatch())(op, args, kwargs)


def _fast_miss(op, args, kwargs, want):
    """The adapter's fast path missed: ``dispatch.dispatch_fast`` -> (result, runner or None)."""
    miss = _DISPATCH[2]
    if miss is None:
        miss = _DISPATCH[2] = _DISPATCH[3]()
    return miss(op, args, kwargs, want)


def install(load_dispatch, load_fast_miss=None) -> None:
    """The PrivateUse1 fallback and npu-aware tensor printing. ``load_dispatch()`` returns
    the function every op goes to (``dispatch.dispatch``), called at the first op;
    ``load_fast_miss()`` the adapter fast path's miss handler (``dispatch.dispatch_fast``)."""
    import torch

    _DISPATCH[1] = load_dispatch
    _DISPATCH[3] = load_fast_miss
    lib = torch.library.Library("_", "IMPL")   # noqa: TOR901 -- a backend fallback needs the global namespace
    lib.fallback(_fallback, "PrivateUse1")
    _LIBS.append(lib)
    # convolution reaches a backend as these two "overrideable" ops, which have a default
    # kernel (an error), so the fallback never sees them: send them to the router as the
    # ops the rules name
    conv = torch.library.Library("aten", "IMPL")   # noqa: TOR901
    conv.impl("convolution_overrideable", _convolution, "PrivateUse1")
    _CONV[0] = conv                    # replaced by the adapter's fast kernel (register_functional)
    aten = torch.library.Library("aten", "IMPL")   # noqa: TOR901
    aten.impl("convolution_backward_overrideable", _convolution_backward, "PrivateUse1")
    # attention: whole (the chip's attention kernel) when no gradient is wanted; else the
    # composition below, in the inputs' dtype (torch's own "math" path upcasts float16 to
    # float32, which a float16-only chip cannot compute)
    aten.impl("scaled_dot_product_attention", _sdpa_device, "PrivateUse1")
    aten.impl("scaled_dot_product_attention", _sdpa_autograd, "AutogradPrivateUse1")
    _LIBS.append(aten)
    _patch_printing()


def _sdpa_device(*args, **kwargs):
    import torch

    return (_DISPATCH[0] or _load_dispatch())(torch.ops.aten.scaled_dot_product_attention.default, args, kwargs)


def _sdpa_autograd(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
    import torch

    wants_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, key, value, attn_mask))
    if not wants_grad:
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.aten.scaled_dot_product_attention.default(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    return sdpa_composite(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def sdpa_composite(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
    """Scaled dot-product attention from differentiable ops, in the inputs' dtype (the
    chip's kernels accumulate in float32): torch's math path with its sqrt(scale) on each
    side, without its float32 upcast."""
    import math

    import torch

    L, S = query.size(-2), key.size(-2)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    if enable_gqa and key.size(-3) != query.size(-3):
        rep = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(rep, -3)
        value = value.repeat_interleave(rep, -3)
    root = math.sqrt(scale)
    attn = (query * root) @ (key * root).transpose(-2, -1)
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool).tril().to(query.device)    # made on the host
        attn = attn.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn = attn.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            attn = attn + attn_mask
    masked = is_causal or attn_mask is not None
    if masked:     # torch's math path (_safe_softmax): a row with every key masked attends to nothing
        dead = (attn == float("-inf")).all(-1, keepdim=True)
    attn = torch.softmax(attn, -1)
    if masked:
        attn = torch.where(dead, 0.0, attn)
    if dropout_p > 0.0:
        attn = torch.nn.functional.dropout(attn, dropout_p)
    return attn @ value


def _convolution(*args, **kwargs):
    import torch

    return (_DISPATCH[0] or _load_dispatch())(torch.ops.aten.convolution.default, args, kwargs)


def _convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    import torch

    bias_sizes = [weight.shape[0]] if output_mask[2] else None
    return (_DISPATCH[0] or _load_dispatch())(torch.ops.aten.convolution_backward.default,
                    (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                     output_padding, groups, output_mask), {})


def register_functional(op_names, adapter=None) -> None:
    """Send the functional overloads ``op_names`` (``aten.mul.Tensor``) straight to the
    router instead of through their ``.out`` form (which would allocate twice). With the
    ``adapter`` loaded, those whose arguments its C++ fast path takes (tensors, numbers, int
    lists: :func:`_fast_capable`) -- convolution included -- get its fast kernel instead of a
    Python one: a signature seen before runs its route's kernel without the Python router."""
    import torch

    todo = [n for n in op_names if n not in _FUNCTIONAL_DONE]
    if not todo:
        return
    fast = []
    if adapter is not None and hasattr(adapter, "install_fast") and _DISPATCH[3] is not None:
        if _CONV[0] is not None and "aten.convolution.default" in todo:
            _CONV[0]._destroy()
            _CONV[0] = None
            fast.append(("convolution_overrideable", "", torch.ops.aten.convolution.default))
    lib = torch.library.Library("aten", "IMPL")   # noqa: TOR901
    for name in todo:
        _FUNCTIONAL_DONE.add(name)
        parts = name.split(".")
        if len(parts) != 3 or parts[0] != "aten":
            continue
        packet = getattr(torch.ops.aten, parts[1], None)
        op = getattr(packet, parts[2], None) if packet is not None else None
        if op is None or op._schema.is_mutable or name in _NOT_ROUTED or _is_view(op) or any(
                torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), k)
                for k in ("PrivateUse1", "CompositeImplicitAutograd")):
            continue   # served already: by the adapter's views and copies, or a composite
        key = op._schema.name.split("::")[1] + ("." + op._schema.overload_name if op._schema.overload_name else "")
        if adapter is not None and _fast_capable(op) and _DISPATCH[3] is not None:
            fast.append((op._schema.name.split("::")[1], op._schema.overload_name, op))
            continue

        def kernel(*args, _op=op, **kwargs):
            return (_DISPATCH[0] or _load_dispatch())(_op, args, kwargs)

        try:
            lib.impl(key, kernel, "PrivateUse1")
        except RuntimeError:   # already has a kernel for this key (another registration)
            continue
    _LIBS.append(lib)
    if fast:
        adapter.install_fast(fast, _fast_miss)


# argument types the adapter's fast path renders as torch's Python kernels receive them
_FAST_TYPES = frozenset({"Tensor", "Optional[Tensor]", "number", "Optional[number]", "int", "Optional[int]",
                         "float", "Optional[float]", "bool", "Optional[bool]", "List[int]",
                         "Optional[List[int]]"})


def _fast_capable(op) -> bool:
    """Whether every argument of ``op`` is one the adapter's fast path takes (no dtype,
    layout, memory format, device, string or tensor-list argument) and it returns tensors."""
    schema = op._schema
    if not all(str(a.real_type) in _FAST_TYPES for a in schema.arguments):
        return False
    return bool(schema.returns) and all(str(r.type) == "Tensor" for r in schema.returns)


# device transfers and copies stay the adapter's (a cast between devices is no kernel's)
_NOT_ROUTED = frozenset({"aten._to_copy.default", "aten.clone.default", "aten.detach.default",
                         "aten.alias.default", "aten.contiguous.default"})


def _is_view(op) -> bool:
    """Returns an alias of an input (transpose, expand, select...): metadata, the adapter's."""
    return any(r.alias_info is not None for r in op._schema.returns)


def install_first_use(ensure):
    """Python stand-ins for the C++ factories while the adapter is not built: the first
    tensor created on ``npu`` builds and loads it, then runs on the C++ kernel. Returns
    the function that removes the stand-ins (called just before the adapter loads)."""
    import torch

    lib = torch.library.Library("aten", "IMPL")   # noqa: TOR901

    def empty(*args, **kwargs):
        ensure()
        return torch.ops.aten.empty.memory_format(*args, **kwargs)

    def empty_strided(*args, **kwargs):
        ensure()
        return torch.ops.aten.empty_strided.default(*args, **kwargs)

    lib.impl("empty.memory_format", empty, "PrivateUse1")
    lib.impl("empty_strided", empty_strided, "PrivateUse1")
    return lib._destroy


def _patch_printing() -> None:
    """Format an npu tensor's values from a host copy (printing runs abs, isfinite,
    masked_select... which would otherwise each be planned, or refused by strict mode);
    the repr still says ``device='npu:N'``."""
    import torch._tensor_str as ts

    if getattr(ts._tensor_str, "_torchfl_npu", False):
        return
    original = ts._tensor_str

    def _tensor_str(self, indent):
        if self.device.type == "npu":
            self = self.detach().to("cpu")
        return original(self, indent)

    _tensor_str._torchfl_npu = True
    ts._tensor_str = _tensor_str
