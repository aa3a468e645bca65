"""Tile and wave quantisation of a matrix kernel's output grid (issue 47 item 3): every
(M, N) plane of a batched GEMM is cut into the HCD's square tiles with the edges padded,
waves are whole, and a grid under one wave fills the idle units only by splitting K."""

from __future__ import annotations

from dataclasses import replace

import pytest

from torchfl.kernels.catalog import CATALOG
from torchfl.kernels.chip import ChipModel
from torchfl.kernels.matmul import plan_gemm
from torchfl.kernels.tiling import time_terms, waves

BASE = ChipModel(name="T", peak={"float32": 20e12}, units={"float32": 108}, offchip_bw=2e12,
                 cache_bytes=40 << 20)
GPU = replace(BASE, concurrent_tiles=108, tile_elements=128 * 128)


def test_edge_tiles_are_padded_per_plane_not_per_batch():
    # 196 x 196 outputs per plane need 2 x 2 tiles of 128 x 128: 58.6 % of the computed rows are useful
    n, eff = waves(0 + 1, GPU, (1000, 196, 196, 512))
    tiles = 1000 * 4
    w = -(-tiles // 108)
    assert n == w and eff == pytest.approx((196 * 196) / (256 * 256) * tiles / (w * 108))
    # the same outputs without a grid (a streaming kernel) are not padded
    assert waves(1000 * 196 * 196, GPU)[1] > eff


def test_exact_multiples_fill_every_tile():
    assert waves(1, GPU, (108, 128, 128, 4096)) == (1, 1.0)
    n, eff = waves(1, GPU, (109, 128, 128, 4096))
    assert n == 2 and eff == pytest.approx(109 / 216)


def test_under_one_wave_split_k_fills_the_chip_only_when_k_is_long():
    # 8 tiles: K = 4096 cuts into 13 slices of >= 128 (8 x 13 = 104 of 108 units busy)
    assert waves(1, GPU, (1, 256, 512, 4096)) == (1, pytest.approx(104 / 108))
    # K = 128: one slice, 8 of 108 units busy
    assert waves(1, GPU, (1, 256, 512, 128)) == (1, pytest.approx(8 / 108))


def test_a_chip_without_a_grain_ignores_the_grid():
    assert waves(10**6, BASE, (7, 196, 196, 64)) == (0, 1.0)


def _bmm(b, m, k, n):
    return CATALOG["bmm"].problem({"a": (b, m, k), "b": (b, k, n)}, {}, "float32")


def test_the_gemm_plan_states_its_grid_and_the_price_uses_it():
    p = plan_gemm(_bmm(64, 196, 64, 196), GPU)
    assert p.config.grid == (64, 196, 196, 64)
    terms = time_terms(p, GPU, "float32")
    assert terms.wave_efficiency == pytest.approx(waves(1, GPU, p.config.grid)[1])
    # padding 196 -> 256 costs compute time against the same GEMM without a grain
    assert terms.compute_s > time_terms(plan_gemm(_bmm(64, 196, 64, 196), BASE), BASE, "float32").compute_s * 1.5


def test_a_skinny_side_is_not_padded_to_a_full_tile():
    # a decode step's one row per plane: GEMV-like kernels, no 128-row padding
    assert waves(1, GPU, (108, 1, 128, 4096)) == (1, 1.0)
    # 64 rows (half of 128) run on 64-row tiles; 65 rows are padded to a full tile
    assert waves(1, GPU, (108, 64, 128, 4096)) == (1, 1.0)
    assert waves(1, GPU, (108, 65, 128, 4096))[1] == pytest.approx(65 / 128)
    # 40 rows: a 64-row tile, 62.5 % useful
    assert waves(1, GPU, (108, 40, 128, 4096))[1] == pytest.approx(40 / 64)


def test_a_matrix_kernel_on_a_many_core_chip_stores_its_tiles_after_the_reduction():
    # head-dim 64 attention scores: short K, the output store is not hidden behind the math
    p = plan_gemm(_bmm(128, 512, 64, 512), GPU)     # K = 64: the reduction, not a narrow output side
    terms = time_terms(p, GPU, "float32")
    bw = GPU.offchip_bw
    reads = sum(c * t.bytes_read for c, t in p.groups) / bw
    writes = sum(c * t.bytes_written for c, t in p.groups) / bw
    assert terms.total_s == pytest.approx(max(terms.compute_s, reads) + writes, rel=1e-9)
    # without a grain (a 1.0 chip) the same plan overlaps its stores: the roofline's max
    flat = time_terms(plan_gemm(_bmm(128, 512, 64, 512), BASE), BASE, "float32")
    assert flat.total_s < terms.total_s
