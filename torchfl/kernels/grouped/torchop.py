"""``torch.ops.torchfl.grouped_mm``: the grouped GEMM as a torch operator of torchfl's own.

Why: ``aten._grouped_mm`` cannot be a rule's op: a rule's op is also routed on the eager device,
where torch's meta kernel of ``_grouped_mm`` refuses float16/float32 (those calls would stop
reaching torch's own per-group ``mm`` loop, on the chip, and fall back to the host). core's
decomposition ``moe_grouped_mm`` rewrites a captured ``aten._grouped_mm`` (bfloat16 models,
meta-device what-if captures) into this operator, which the ``grouped_mm`` kernel serves; the
eager device never sees it. Its CPU body is transformers' loop (one ``mm`` per expert, zeros
past the last offset); its fake implementation gives the shape for any float dtype.

Registered by :func:`register` (idempotent): ``torchfl.kernels.grouped`` calls it when torch is
already imported (rule queries never import torch), the planner's capture imports torch first."""
_DONE: list = []


def register() -> None:
    if _DONE:
        return
    import torch

    if hasattr(torch.ops.torchfl, "grouped_mm"):
        _DONE.append(True)
        return

    @torch.library.custom_op("torchfl::grouped_mm", mutates_args=(),
                             schema="(Tensor x, Tensor w, Tensor offs) -> Tensor")
    def grouped_mm(x, w, offs):
        out = torch.zeros(x.shape[0], w.shape[2], dtype=x.dtype, device=x.device)
        start = 0
        for e, end in enumerate(offs.tolist()):
            if end > start:
                out[start:end] = x[start:end] @ w[e]
            start = max(start, end)
        return out

    @grouped_mm.register_fake
    def _(x, w, offs):
        torch._check(x.dim() == 2 and w.dim() == 3 and offs.dim() == 1,
                     lambda: "torchfl.grouped_mm: expects x[S, K], w[E, K, N], offs[E]")
        return x.new_empty(x.shape[0], w.shape[2])

    _DONE.append(grouped_mm)
