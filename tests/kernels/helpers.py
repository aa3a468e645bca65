"""Shared helpers for kernel tests: device tensors from torch, tolerance checks, and the
counted == predicted / bigger-cache checks every kernel must pass."""
import numpy as np
import torch

from torchfl.kernels import ChipModel, DeviceMemory, DeviceTensor
from torchfl.kernels.catalog import CATALOG

from .tolerances import TOL

CACHES = (16 << 10, 256 << 10, 8 << 20)   # small caches force streamed tiles


def chip_for(dtype, cache=8 << 20, **kw):
    emu = dtype == "bfloat16_emulated"
    return ChipModel(cache_bytes=cache, bf16_emulation=emu, **kw)


def storage(dtype):
    return "bfloat16" if dtype == "bfloat16_emulated" else dtype


def dev(x, mem, dtype=None, layout=None):
    """torch tensor -> DeviceTensor (rounded into ``dtype`` storage)."""
    if dtype is not None and dtype not in ("int8", "int32", "int64", "bool"):
        x = x.to(torch.float32).to(getattr(torch, storage(dtype)))
    return DeviceTensor.from_torch(x, mem, layout=layout)


def as_f32(t):
    """Device tensor -> float32 torch tensor of its logical values."""
    return torch.from_numpy(t.to_numpy().astype(np.float32) if t.dtype != "bool" else t.to_numpy())


def round_to(ref, dtype):
    """The torch reference rounded to the storage dtype, as float32."""
    if dtype in ("float16", "bfloat16", "bfloat16_emulated"):
        return ref.to(getattr(torch, storage(dtype))).to(torch.float32)
    return ref


def assert_close(got, ref, dtype, scale=1.0, what=""):
    rtol, atol = TOL[dtype]
    ref = round_to(ref.to(torch.float32), dtype) if got.dtype == torch.float32 else ref
    torch.testing.assert_close(got, ref, rtol=rtol * scale, atol=atol * scale, equal_nan=True,
                               msg=lambda m: f"{what} [{dtype}]: {m}")


def run_checked(name, chip, inputs, attrs=None):
    """Run a kernel with its plan, assert counted == predicted, and return outputs+plan."""
    spec = CATALOG[name]
    prob = spec.problem({k: v.shape for k, v in inputs.items()}, attrs, None if not spec.mixed_dtypes else None,
                        {k: v.layout for k, v in inputs.items()}, {k: v.dtype for k, v in inputs.items()})
    plan = spec.tile(prob, chip)
    assert plan.on_chip_bytes <= chip.cache_bytes, (plan.on_chip_bytes, chip.cache_bytes)
    outs, counted = spec.run(chip, inputs, attrs, plan=plan)
    assert counted == plan.traffic, f"{name}: counted {counted} != predicted {plan.traffic} ({plan.config})"
    metas = spec.output_meta(prob)
    assert [(o.shape, o.dtype) for o in outs] == [(m.shape, m.dtype) for m in metas]
    return outs, plan


def run_weight_stationary_convs(chip):
    """Both float weight-stationary conv paths in float16: one tile (``conv_tile_fused``) on
    ``chip``, many tiles (``conv_tiles``) on a 16 KB cache; for tests that look at what they compiled."""
    attrs = {"padding": (1, 1)}
    mem = DeviceMemory(chip)
    run_checked("conv2d", chip, {"x": dev(torch.randn(1, 8, 12, 12), mem, "float16"),
                                 "weight": dev(torch.randn(16, 8, 3, 3), mem, "float16")}, attrs)
    small = chip_for("float16", 16 << 10)
    ms = DeviceMemory(small)
    run_checked("conv2d", small, {"x": dev(torch.randn(1, 16, 28, 28), ms, "float16"),
                                  "weight": dev(torch.randn(32, 16, 3, 3), ms, "float16")}, attrs)


def bytes_monotone(name, inputs_shapes, attrs, dtype, caches=(4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 8 << 20),
                   layouts=None, dtypes=None):
    """A bigger cache never increases the predicted (= counted) off-chip bytes."""
    spec = CATALOG[name]
    prob = spec.problem(inputs_shapes, attrs, dtype, layouts, dtypes)
    last = None
    for c in caches:
        try:
            plan = spec.tile(prob, ChipModel(cache_bytes=c))
        except Exception:
            assert last is None, f"{name}: cache {c} refused after a smaller one worked"
            continue
        b = plan.traffic.bytes
        if last is not None:
            assert b <= last, f"{name}: cache {c} moves {b} B > {last} B with a smaller cache"
        last = b
    assert last is not None


def conv_checked(shape, dtype="float32"):
    """conv2d of a random (N, C, HW, HW) input by (K, C/groups, R, R) weights, padding R // 2,
    run with its plan (counted == predicted) and checked against torch; ``shape`` is
    (N, C, HW, K, R, groups)."""
    import torch.nn.functional as F

    n, c, hw, k, r, groups = shape
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    x, w = dev(torch.randn(n, c, hw, hw), mem, dtype), dev(torch.randn(k, c // groups, r, r), mem, dtype)
    (y,), _ = run_checked("conv2d", chip, {"x": x, "weight": w}, {"padding": r // 2, "groups": groups})
    assert_close(as_f32(y), F.conv2d(as_f32(x), as_f32(w), padding=r // 2, groups=groups), dtype, scale=3)


def conv_backward_checked():
    """The input and weight gradients of a 2x8x6x6 by 16x8x3x3 conv (padding 1), each run with
    its plan and checked against autograd's."""
    import torch.nn.functional as F

    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    x, w = torch.randn(2, 8, 6, 6, requires_grad=True), torch.randn(16, 8, 3, 3, requires_grad=True)
    y = F.conv2d(x, w, padding=1)
    gy = torch.randn_like(y)
    y.backward(gy)
    (dx,), _ = run_checked("conv2d_backward_input", chip, {"grad_out": dev(gy, mem), "weight": dev(w.detach(), mem)},
                           {"padding": 1, "input_shape": tuple(x.shape)})
    assert_close(as_f32(dx), x.grad, "float32", scale=3)
    (dw,), _ = run_checked("conv2d_backward_weight", chip, {"grad_out": dev(gy, mem), "x": dev(x.detach(), mem)},
                           {"padding": 1, "weight_shape": tuple(w.shape)})
    assert_close(as_f32(dw), w.grad, "float32", scale=9)


def run_fresh_cache(script, tmp_path, timeout):
    """``script`` in a new interpreter at the project's root with an empty kernel cache (under
    ``tmp_path``): its stdout, once it exits 0."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    r = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout
