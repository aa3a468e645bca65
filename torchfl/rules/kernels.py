"""Which kernel names a rule may use, and what each takes: the kernel catalog's contract.

The catalog (:mod:`torchfl.kernels.catalog`, pure Python) is authoritative for inputs and
attrs. The names fixed in docs/ARCHITECTURE.md ("kernels may add more, never rename
these") are accepted too, so a pack can be checked while a family is still being built.
"""

from __future__ import annotations

from functools import lru_cache

# docs/ARCHITECTURE.md, "Kernel catalog names".
ARCHITECTURE_NAMES = {
    "matmul": "matmul bmm linear linear_relu linear_gelu layernorm_linear",
    "conv": "conv2d conv2d_relu conv2d_bn conv2d_bn_relu conv2d_add_relu conv2d_backward_input conv2d_backward_weight",
    "pool": "max_pool2d avg_pool2d adaptive_avg_pool2d max_pool2d_backward avg_pool2d_backward "
            "adaptive_avg_pool2d_backward",
    "norm": "batch_norm_infer batch_norm_train batch_norm_backward layer_norm layer_norm_backward",
    "elementwise": "add sub mul div relu gelu silu sigmoid tanh neg rsqrt pow where relu_backward gelu_backward "
                   "silu_backward sigmoid_backward tanh_backward",
    "softmax": "softmax log_softmax softmax_backward log_softmax_backward",
    "attention": "attention",
    "embedding": "embedding embedding_backward",
    "reduce": "sum mean amax",
    "layout": "layout_transform copy reshape concat slice expand",
    "cast": "cast",
}
FUSED = {"linear_relu", "linear_gelu", "layernorm_linear", "conv2d_relu", "conv2d_bn", "conv2d_bn_relu",
         "conv2d_add_relu"}


@lru_cache(maxsize=1)
def catalog() -> dict:
    """The kernel catalog, or {} while it cannot be imported."""
    try:
        from torchfl.kernels.catalog import CATALOG
    except Exception:  # noqa: BLE001 - a family under construction must not break rule checking
        return {}
    return dict(CATALOG)


def kernel_names() -> dict[str, str]:
    """name -> family, catalog first."""
    names = {n: fam for fam, ns in ARCHITECTURE_NAMES.items() for n in ns.split()}
    names.update({n: s.family for n, s in catalog().items()})
    return names


def spec(name: str):
    """The KernelSpec, or None if the catalog does not (yet) have it."""
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
