"""Which of PyTorch's OpInfo entries exercise which ATen overload (data, no torch at import).

OpInfos are named after the Python API (``nn.functional.conv2d``, ``softmax``); rule packs
name ATen overloads (``aten.convolution.default``, ``aten._softmax.default``). This table
says which OpInfos to draw samples from for an overload; which overload a sample really
exercises is read from its captured graph (``cases.graph_ops``), so a sample of ``sum``
counts for ``aten.sum.default`` or ``aten.sum.dim_IntList`` as its graph says.

Overloads missing here have no forward OpInfo (the training ops: backward kernels are
checked by the training tests) and stay *unverified* in the evidence.
"""

from __future__ import annotations

#: ATen overload -> OpInfo names (``name`` or ``name.variant`` as in op_db)
OPINFOS: dict[str, tuple[str, ...]] = {
    "aten.add.Tensor": ("add",),
    "aten.add.Scalar": ("add",),
    "aten.sub.Tensor": ("sub",),
    "aten.sub.Scalar": ("sub",),
    "aten.mul.Tensor": ("mul",),
    "aten.mul.Scalar": ("mul",),
    "aten.div.Tensor": ("div.no_rounding_mode",),
    "aten.div.Scalar": ("div.no_rounding_mode",),
    "aten.relu.default": ("nn.functional.relu",),
    "aten.silu.default": ("nn.functional.silu",),
    "aten.sigmoid.default": ("sigmoid",),
    "aten.tanh.default": ("tanh",),
    "aten.neg.default": ("neg",),
    "aten.rsqrt.default": ("rsqrt",),
    "aten.gelu.default": ("nn.functional.gelu",),
    "aten.pow.Tensor_Scalar": ("pow",),
    "aten.pow.Tensor_Tensor": ("pow",),
    "aten.where.self": ("where",),
    "aten.minimum.default": ("minimum",),
    "aten.maximum.default": ("maximum",),
    "aten.clamp.default": ("clamp",),
    "aten._softmax.default": ("softmax",),
    "aten._log_softmax.default": ("log_softmax",),
    "aten.convolution.default": ("nn.functional.conv2d",),
    "aten.conv2d.default": ("nn.functional.conv2d",),
    "aten.mm.default": ("mm", "matmul"),
    "aten.addmm.default": ("addmm", "nn.functional.linear"),
    "aten.bmm.default": ("bmm", "matmul"),
    "aten.linear.default": ("nn.functional.linear",),
    "aten.matmul.default": ("matmul",),
    "aten._native_batch_norm_legit_no_training.default": ("nn.functional.batch_norm",),
    "aten.native_layer_norm.default": ("nn.functional.layer_norm",),
    "aten.layer_norm.default": ("nn.functional.layer_norm",),
    "aten.embedding.default": ("nn.functional.embedding",),
    "aten.max_pool2d_with_indices.default": ("nn.functional.max_pool2d",),
    "aten.max_pool2d.default": ("nn.functional.max_pool2d",),
    "aten.avg_pool2d.default": ("nn.functional.avg_pool2d",),
    "aten._adaptive_avg_pool2d.default": ("nn.functional.adaptive_avg_pool2d",),
    "aten.adaptive_avg_pool2d.default": ("nn.functional.adaptive_avg_pool2d",),
    "aten.mean.dim": ("mean",),
    "aten.mean.default": ("mean",),
    "aten.sum.dim_IntList": ("sum",),
    "aten.sum.default": ("sum",),
    "aten.amax.default": ("amax",),
    "aten.linalg_vector_norm.default": ("linalg.vector_norm", "nn.functional.normalize"),
    "aten.view.default": ("view", "reshape"),
    "aten._unsafe_view.default": ("reshape",),
    "aten.reshape.default": ("reshape",),
    "aten.unsqueeze.default": ("unsqueeze",),
    "aten.squeeze.dim": ("squeeze",),
    "aten.permute.default": ("permute",),
    "aten.transpose.int": ("transpose",),
    "aten.t.default": ("t",),
    "aten.expand.default": ("expand",),
    "aten.cat.default": ("cat",),
    "aten.slice.Tensor": ("narrow",),
    "aten.select.int": ("select",),
    "aten.split_with_sizes.default": ("split_with_sizes",),
    "aten.clone.default": ("clone",),
    "aten.contiguous.default": ("contiguous",),
    "aten._to_copy.default": ("to",),
    "aten.scaled_dot_product_attention.default": ("nn.functional.scaled_dot_product_attention",),
    # gathers, scan, padding, 1-D convolution, group norm (core 1.6.0)
    "aten.gather.default": ("gather",),
    "aten.index_select.default": ("index_select",),
    "aten.cumsum.default": ("cumsum",),
    "aten.constant_pad_nd.default": ("nn.functional.pad.constant",),
    "aten.native_group_norm.default": ("nn.functional.group_norm",),
    "aten.squeeze.dims": ("squeeze.multiple",),
}


def opinfos_for(overloads) -> dict[str, tuple[str, ...]]:
    """OpInfo name -> the claimed overloads it may exercise, for ``overloads``."""
    out: dict[str, list[str]] = {}
    for op in overloads:
        for name in OPINFOS.get(op, ()):
            out.setdefault(name, []).append(op)
    return {k: tuple(sorted(v)) for k, v in sorted(out.items())}


def lookup(name: str):
    """The OpInfo called ``name`` (``name.variant``) in torch's op_db."""
    from torch.testing._internal.common_methods_invocations import op_db

    global _BY_NAME
    if _BY_NAME is None:
        _BY_NAME = {(o.name + (f".{o.variant_test_name}" if o.variant_test_name else "")): o for o in op_db}
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no OpInfo {name!r} in this torch's op_db (torchfl/conformance/opinfos.py needs an update)") \
            from None


_BY_NAME = None
