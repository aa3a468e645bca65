"""``torch.ops.torchfl.selective_scan``: Mamba's selective scan as one torch operator.

Why: transformers' torch-only path of the scan is a Python loop over time (eager) or, under
torch.compile, an associative scan that Dynamo unrolls into a tree of slices: a few hundred
small steps per layer, none of which says "scan". ``torchfl.kernels.ssm.hf_route`` routes
transformers' ``mamba_selective_scan`` here for ``npu`` tensors and for torchfl's compiled
graphs; core's rule maps the operator to the ``selective_scan`` kernel (kernels/ssm).

Same contract as mamba_ssm's ``selective_scan_fn``: ``u, delta, z [B, D, L]``, ``A [D, N]``,
``B, C [B, N, L]``, ``D, delta_bias [D]``; returns ``(y [B, D, L], last_state [B, D, N])``
in ``u``'s dtype, computed in float32. The CPU body is the reference recurrence (what the
kernel's tests compare with); only CPU has a body, so on ``npu`` the call reaches torchfl's
PrivateUse1 router, which serves it with the kernel. Registered by :func:`register`
(idempotent), called where torch is already imported."""
_DONE: list = []

SCHEMA = ("(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None, Tensor? z=None, "
          "Tensor? delta_bias=None, bool delta_softplus=False) -> (Tensor, Tensor)")


def reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """The recurrence in float32 torch, step by step (the definition the kernel is tested against)."""
    import torch
    import torch.nn.functional as F

    dt = delta.float()
    if delta_bias is not None:
        dt = dt + delta_bias.float()[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    uf, Af, Bf, Cf = u.float(), A.float(), B.float(), C.float()
    h = torch.zeros(u.shape[0], u.shape[1], A.shape[1], dtype=torch.float32, device=u.device)
    ys = []
    for t in range(u.shape[2]):
        h = torch.exp(dt[:, :, t, None] * Af) * h + (dt[:, :, t] * uf[:, :, t])[..., None] * Bf[:, None, :, t]
        ys.append((h * Cf[:, None, :, t]).sum(-1))
    y = torch.stack(ys, -1) if ys else uf.new_zeros(u.shape)
    if D is not None:
        y = y + uf * D.float()[:, None]
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(u.dtype), h.to(u.dtype)


def register() -> None:
    if _DONE:
        return
    import torch

    if hasattr(torch.ops.torchfl, "selective_scan"):
        _DONE.append(True)
        return

    @torch.library.custom_op("torchfl::selective_scan", mutates_args=(), device_types="cpu", schema=SCHEMA)
    def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
        return reference(u, delta, A, B, C, D, z, delta_bias, delta_softplus)

    @selective_scan.register_fake
    def _(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
        torch._check(u.dim() == 3 and A.dim() == 2 and B.dim() == 3,
                     lambda: "torchfl.selective_scan: expects u[B, D, L], A[D, N], B[B, N, L]")
        return u.new_empty(u.shape), u.new_empty(u.shape[0], u.shape[1], A.shape[1])

    _DONE.append(selective_scan)
