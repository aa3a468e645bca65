"""The selective scan (kernels/ssm: selective_scan) against the recurrence it replaces
(``torchfl.kernels.ssm.torchop.reference``: transformers' / mamba_ssm's step-by-step loop, float32
torch) on the same rounded inputs: float32 / float16 / bfloat16 u with float32 A, D and bias (as
Mamba computes them), with and without D, z and the bias, the softplus on and off; a cache so
small the channels are tiled (B and C then read once per channel tile); empty length; the
counted bytes equal the plan's; refusals.

Tolerance, relative to the largest |output|: float32 1e-5 (float32 exp and summation order
against torch's); float16 / bfloat16 one rounding of the float32 result on store: 1e-3 / 8e-3.
The last state gets the same tolerances."""
import pytest
import torch

from tests.kernels.helpers import dev
from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import get
from torchfl.kernels.ssm.torchop import reference

TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def inputs(bt=2, d=12, l=9, n=5, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"u": torch.randn(bt, d, l, generator=g).to(dtype),
            "delta": (torch.randn(bt, d, l, generator=g) * 0.5 - 1).to(dtype),
            "A": -torch.rand(d, n, generator=g) * 4 - 0.1,
            "B": torch.randn(bt, n, l, generator=g).to(dtype),
            "C": torch.randn(bt, n, l, generator=g).to(dtype),
            "D": torch.randn(d, generator=g),
            "z": torch.randn(bt, d, l, generator=g).to(dtype),
            "delta_bias": torch.randn(d, generator=g) * 0.1}


def run(chip, ins, softplus=True):
    spec = get("selective_scan")
    mem = DeviceMemory(chip)
    d = {k: dev(v, mem) for k, v in ins.items()}
    prob = spec.problem({k: v.shape for k, v in d.items()}, {"delta_softplus": softplus}, None,
                        {k: v.layout for k, v in d.items()}, {k: v.dtype for k, v in d.items()})
    plan = spec.tile(prob, chip)
    assert plan.on_chip_bytes <= chip.cache_bytes
    (y, last), counted = spec.run(chip, d, {"delta_softplus": softplus}, plan=plan)
    return y.to_torch().float(), last.to_torch().float(), plan, counted


def _close(got, ref, dtype):
    scale = max(1.0, ref.abs().max().item())
    assert (got - ref.float()).abs().max().item() <= TOL[dtype] * scale, (got - ref.float()).abs().max()


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
@pytest.mark.parametrize("optional", ("all", "none", "no_z"))
def test_matches_the_recurrence(dtype, optional):
    ins = inputs(dtype=dtype)
    if optional == "none":
        ins = {k: v for k, v in ins.items() if k not in ("D", "z", "delta_bias")}
        ins["delta"] = ins["delta"].abs() * 0.2          # a time step as is: positive, no softplus
    elif optional == "no_z":
        del ins["z"]
    softplus = optional != "none"
    y, last, plan, counted = run(ChipModel(), ins, softplus)
    ry, rlast = reference(**ins, delta_softplus=softplus)
    _close(y, ry, dtype)
    _close(last, rlast, dtype)
    assert y.shape == ry.shape and last.shape == (2, 12, 5)
    assert counted == plan.traffic
    assert plan.config.tile("channels") == 12 and "B and C read once" in plan.config.notes


def test_small_cache_tiles_the_channels():
    """A 2 KiB cache: the channels are cut into tiles, B and C read once per tile (priced and counted)."""
    ins = inputs(d=40, l=20, n=8, dtype=torch.float16)
    y, last, plan, counted = run(ChipModel(cache_bytes=2 << 10), ins)
    ry, rlast = reference(**ins, delta_softplus=True)
    _close(y, ry, torch.float16)
    _close(last, rlast, torch.float16)
    td = plan.config.tile("channels")
    assert td < 40 and counted == plan.traffic
    tiles = -(-40 // td)
    big = run(ChipModel(), ins)[2]
    assert plan.traffic.bytes_read - big.traffic.bytes_read == 2 * (tiles - 1) * 8 * 20 * 2 * 2   # B, C again
    assert plan.traffic.flops == big.traffic.flops == 2 * 40 * 20 * (9 * 8 + 12)


def test_large_delta_takes_softplus_threshold_and_nan_carries():
    ins = inputs(d=4, l=6, n=3)
    ins["delta"][0, 0, 2] = 30.0                     # softplus(30) = 30 (torch's threshold 20)
    ins["u"][1, 2, 3] = float("nan")
    y, last, _, _ = run(ChipModel(), ins)
    ry, rlast = reference(**ins, delta_softplus=True)
    assert torch.isnan(y[1, 2, 3:]).all() and torch.isnan(ry[1, 2, 3:]).all()
    ok = ~torch.isnan(ry)
    _close(y[ok], ry[ok], torch.float32)


def test_empty_length_and_refusals():
    ins = inputs(l=0)
    y, last, plan, counted = run(ChipModel(), ins)
    assert y.shape == (2, 12, 0) and torch.equal(last, torch.zeros(2, 12, 5)) and counted == plan.traffic
    spec = get("selective_scan")
    with pytest.raises(KernelError, match=r"B must be \[2, 5, 9\]"):
        spec.problem({"u": (2, 12, 9), "delta": (2, 12, 9), "A": (12, 5), "B": (2, 9, 5), "C": (2, 5, 9)}, {},
                     None, {}, {})
    with pytest.raises(KernelError, match="A must be"):
        spec.problem({"u": (2, 12, 9), "delta": (2, 12, 9), "A": (5, 12), "B": (2, 5, 9), "C": (2, 5, 9)}, {},
                     None, {}, {})
    with pytest.raises(KernelError, match="cache"):
        spec.tile(spec.problem({"u": (1, 4, 4), "delta": (1, 4, 4), "A": (4, 4096), "B": (1, 4096, 4),
                                "C": (1, 4096, 4)}, {}, None, {}, {}), ChipModel(cache_bytes=4 << 10))


def test_cpu_operator_is_the_reference():
    """torch.ops.torchfl.selective_scan on CPU: its body, the same numbers as the reference."""
    from torchfl.kernels.ssm.torchop import register

    register()
    ins = inputs()
    y, last = torch.ops.torchfl.selective_scan(**ins, delta_softplus=True)
    ry, rlast = reference(**ins, delta_softplus=True)
    assert torch.equal(y, ry) and torch.equal(last, rlast)


def test_many_cores_split_the_channels():
    """On a chip of 64 cores one (batch, channel tile) unit would leave 63 idle: the channels are cut
    (B and C re-read per tile, priced and counted) where that lowers bytes over busy cores; one core
    keeps every channel in one tile. The numbers stay the recurrence's."""
    ins = inputs(bt=1, d=256, l=32, n=16, dtype=torch.float16)
    y, last, plan, counted = run(ChipModel(concurrent_tiles=64, tile_elements=256), ins)
    one = run(ChipModel(), ins)[2]
    assert one.config.tile("channels") == 256 and one.config.parallel_units == 1
    td = plan.config.tile("channels")
    assert td < 256 and plan.config.parallel_units == -(-256 // td) > 1 and counted == plan.traffic
    assert plan.traffic.bytes_read > one.traffic.bytes_read
    ry, rlast = reference(**ins, delta_softplus=True)
    _close(y, ry, torch.float16)
    _close(last, rlast, torch.float16)
