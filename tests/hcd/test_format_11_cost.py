"""The cost model's format-1.1 terms, on the one time formula (``simulated_time``): a
launch cost per kernel, sustained compute and bandwidth, wave quantisation; and where
each shows in a priced step's notes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from torchfl.kernels.chip import ChipModel
from torchfl.kernels.tiling import TileConfig, Traffic, make_plan, simulated_time, time_terms, waves

BASE = ChipModel(name="T", peak={"float16": 100e12}, units={"float16": 100}, offchip_bw=1e12)


def plan(flops, nbytes, written=0, tiles=1, double=False):
    per = Traffic(nbytes - written, written, flops)
    cfg = TileConfig("streamed" if tiles > 1 else "resident", (), double, "why")
    return make_plan("k", (), cfg, ((tiles, per),), 0)


def test_launch_is_paid_once_per_kernel_not_per_tile():
    chip = replace(BASE, launch_s=4.5e-6)
    p = plan(0, 10**6, tiles=8, double=True)
    assert simulated_time(p, chip, "float16") == pytest.approx(simulated_time(p, BASE, "float16") + 4.5e-6)
    # a bare Traffic is one kernel too; an empty plan (a metadata reshape) launches nothing
    assert simulated_time(Traffic(10**6, 0, 0), chip, "float16") == pytest.approx(1e-6 + 4.5e-6)
    assert simulated_time(make_plan("k", (), TileConfig("metadata"), (), 0), chip, "float16") == 0.0


def test_matrix_kernels_pay_the_matrix_launch():
    chip = replace(BASE, launch_s=12e-6, matrix_launch_s=21e-6)
    gemm = make_plan("matmul", (), TileConfig("resident"), ((1, Traffic(10**6, 0, 0)),), 0)
    soft = make_plan("softmax", (), TileConfig("resident"), ((1, Traffic(10**6, 0, 0)),), 0)
    assert simulated_time(gemm, chip, "float16") == pytest.approx(1e-6 + 21e-6)
    assert simulated_time(soft, chip, "float16") == pytest.approx(1e-6 + 12e-6)
    assert chip.launch_for("conv2d") == 21e-6 and chip.launch_for("gelu") == 12e-6
    assert replace(chip, matrix_launch_s=None).launch_for("matmul") == 12e-6


def test_sustained_fractions_scale_the_binding_term():
    chip = replace(BASE, sustained={"float16": 0.5}, offchip_sustained=0.8)
    compute = plan(10**12, 1000)            # 10 ms of compute at peak, 1 ns of memory
    memory = plan(1000, 10**9)              # 1 ms of memory at the rated bandwidth
    assert simulated_time(compute, chip, "float16") == pytest.approx(2 * simulated_time(compute, BASE, "float16"),
                                                                     rel=1e-6)
    assert simulated_time(memory, chip, "float16") == pytest.approx(simulated_time(memory, BASE, "float16") / 0.8,
                                                                    rel=1e-6)
    # bfloat16 on the fp16 unit sustains what the unit does; a dtype with no stated fraction: 1
    assert chip.sustained_for("bfloat16") == 0.5
    assert replace(chip, sustained={}).sustained_for("float16") == 1.0


def test_a_kernel_whose_tiles_fill_one_wave_and_a_bit_costs_two_waves():
    chip = replace(BASE, concurrent_tiles=108, tile_elements=16384)
    assert waves(108 * 16384, chip) == (1, 1.0)
    n, eff = waves(109 * 16384, chip)
    assert n == 2 and eff == pytest.approx(109 / 216)
    assert waves(1, chip) == (1, 1.0)              # less than a wave: the library splits K to fill the chip
    assert waves(107 * 16384, chip) == (1, 1.0)
    assert waves(217 * 16384, chip) == (3, pytest.approx(217 / 324))
    full = plan(10**12, 108 * 16384 * 2, written=108 * 16384 * 2, double=True)   # fp16 out: 2 B each
    over = plan(10**12, 109 * 16384 * 2, written=109 * 16384 * 2, double=True)
    t_full, t_over = simulated_time(full, chip, "float16"), simulated_time(over, chip, "float16")
    assert t_full == pytest.approx(10e-3)
    assert t_over == pytest.approx(10e-3 * 216 / 109)                  # ~2x: the second wave is nearly empty
    # without a grain, the same plans are priced by the 1.0 roofline
    assert simulated_time(over, BASE, "float16") == pytest.approx(10e-3)


def test_a_memory_bound_kernel_is_not_slowed_by_its_waves():
    chip = replace(BASE, concurrent_tiles=108, tile_elements=16384)
    p = plan(10**6, 10**9, written=1000, double=True)     # few outputs, many bytes: a reduction
    assert simulated_time(p, chip, "float16") == pytest.approx(simulated_time(p, BASE, "float16"))


def test_time_terms_say_where_a_11_number_moved_the_time():
    chip = replace(BASE, launch_s=4.5e-6, offchip_sustained=0.82, sustained={"float16": 0.9},
                   concurrent_tiles=108, tile_elements=16384)
    mem = time_terms(plan(1000, 10**9), chip, "float16")
    assert mem.bound == "off-chip"
    assert mem.notes() == ["+4.5 us launch", "off-chip bound at 82% sustained"]
    comp = time_terms(plan(10**12, 109 * 16384 * 2, written=109 * 16384 * 2), chip, "float16")
    assert comp.bound == "compute" and comp.waves == 2
    assert comp.notes() == ["+4.5 us launch", "compute bound at 90% sustained", "2 waves, 50% full"]
    assert time_terms(plan(1000, 10**9), BASE, "float16").notes() == []


def test_priced_step_notes_carry_the_11_terms_and_a_10_chip_keeps_its_tile_dict():
    from torchfl.planner.cost import price_plan

    p = plan(1000, 10**9)
    chip = replace(BASE, launch_s=12e-6, offchip_sustained=0.855)
    priced = price_plan(p, chip, "float16")
    assert priced.tile["notes"] == "why; +12 us launch; off-chip bound at 86% sustained"
    assert priced.time_s == pytest.approx(12e-6 + 1e-3 / 0.855)
    assert price_plan(p, BASE, "float16").tile == p.config.as_dict()


def test_chip_model_refuses_nonsense_11_numbers():
    with pytest.raises(ValueError, match="launch_s"):
        replace(BASE, launch_s=-1.0)
    with pytest.raises(ValueError, match="sustained fraction"):
        replace(BASE, offchip_sustained=1.5)
    with pytest.raises(ValueError, match="together"):
        replace(BASE, concurrent_tiles=108)


def test_a_1d_tensor_has_no_batch_dimension():
    """Issue 32: a GELU over 1M values was refused with "Batch size 1048576 exceeds
    max_batch_size"; a 1-D input's only axis is its data."""
    import torch

    from torchfl.hcd import load_hcd
    from torchfl.planner.api import plan_module
    from torchfl.resources import bundled_path

    hcd = load_hcd(bundled_path("hcd_registry") / "npu_v3.hcd")
    x = torch.empty(1 << 20, dtype=torch.float16, device="meta")
    plan = plan_module(torch.nn.GELU(approximate="tanh"), (x,), chip=hcd)
    assert [s.kernel for s in plan.steps] == ["gelu"]
    from torchfl.planner.errors import HardConstraintError

    with pytest.raises(HardConstraintError, match="Batch size 1024 of input"):   # 2-D: dim 0 is the batch
        plan_module(torch.nn.GELU(), (torch.empty(1024, 8, dtype=torch.float16, device="meta"),), chip=hcd)
