"""Autocast on the ``npu`` device: ``torch.autocast("npu", dtype=torch.float16)``.

torch ships autocast kernels for CPU, CUDA, XPU and MPS only; for a PrivateUse1 backend
the ``AutocastPrivateUse1`` dispatch key has no kernel at all, and every op inside an npu
autocast region fails ("Could not run 'aten::linear' with arguments from the 'Autocastnpu'
backend"). This module gives that key CUDA's policy (``aten/src/ATen/autocast_mode.cpp``):

* a fallthrough for every op (no cast, no Python on the way);
* ops that gain from lower precision (convolutions, matmuls, linear, attention) cast their
  floating npu arguments to the autocast dtype;
* ops that need float32's range (exp/log family, norms, softmax, sums, losses) cast them to
  float32 -- and batch-norm, which CUDA leaves alone (see ``FP32``);
* ops with several floating inputs that must agree (cat, stack, addcmul...) promote them
  to the widest.

Casts are ``Tensor.to`` calls, so autograd sees them: gradients of float32 parameters come
back float32 (the cast's backward), as under CUDA autocast. Installed on the first
``torch.autocast("npu")`` (torch asks ``torch.npu.get_amp_supported_dtype`` then), so a
process that never uses autocast registers nothing. The key is active only inside an npu
autocast region: outside it no op reaches these kernels.
"""
from __future__ import annotations

import threading

__all__ = ["install", "LOWER_PRECISION", "FP32", "PROMOTE"]

# op base names (every functional overload of each)
LOWER_PRECISION = (
    "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "linalg_vecdot", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm",
    "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    # not in CUDA's lists (cuDNN takes float16 activations with float32 weights and running
    # statistics): the chip's batch-norm kernels take one dtype for all their inputs, and
    # the running statistics stay float32, so the activation comes up to float32 (the next
    # convolution casts it back down)
    "batch_norm", "instance_norm",
    # CUDA's "fp32_set_opt_dtype" ops: computed and returned in float32
    "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_bilinear2d",
    "upsample_linear1d", "upsample_trilinear3d", "upsample_bicubic2d",
)
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
           "scatter_add", "tensordot", "cat", "stack", "index_copy")

_LOCK = threading.Lock()
_LIBS: list = []


def _cast(value, dtype):
    """``value`` with its floating npu tensors (not float64) cast to ``dtype``."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.dtype is not dtype and value.dtype is not torch.float64 \
                and value.device.type == "npu":
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _widest(values, found=None):
    import torch

    for v in values:
        if isinstance(v, torch.Tensor):
            if v.is_floating_point() and v.device.type == "npu" and v.dtype is not torch.float64:
                found = v.dtype if found is None else torch.promote_types(found, v.dtype)
        elif isinstance(v, (list, tuple)):
            found = _widest(v, found)
    return found


def _kernel(op, policy):
    import torch

    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def kernel(*args, **kwargs):
        if policy == "lower":
            dtype = torch.get_autocast_dtype("npu")
        elif policy == "fp32":
            dtype = torch.float32
        else:
            dtype = _widest(args, _widest(kwargs.values()))
        if dtype is not None:
            args = _cast(args, dtype)
            kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(keys):
            return op(*args, **kwargs)

    return kernel


def install() -> None:
    """Register the autocast kernels (once per process)."""
    with _LOCK:
        if _LIBS:
            return
        import torch

        fallback = torch.library.Library("_", "IMPL")   # noqa: TOR901 -- a fallback needs the global namespace
        fallback.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
        _LIBS.append(fallback)
        lib = torch.library.Library("aten", "IMPL")   # noqa: TOR901
        for policy, names in (("lower", LOWER_PRECISION), ("fp32", FP32), ("promote", PROMOTE)):
            for base in names:
                packet = getattr(torch.ops.aten, base, None)
                if packet is None:
                    continue
                for overload in packet.overloads():
                    op = getattr(packet, overload)
                    schema = op._schema
                    if schema.is_mutable or any(a.alias_info is not None for a in schema.returns):
                        continue       # out= and in-place forms: autocast leaves them as they are
                    key = base if overload == "default" else f"{base}.{overload}"
                    lib.impl(key, _kernel(op, policy), "AutocastPrivateUse1")
        _LIBS.append(lib)
