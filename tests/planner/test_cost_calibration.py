"""The cost model prices what a chip really pays from HCD numbers only: idle vector lanes
(a conv whose vectorised runs are short), the double-buffered pipeline's fill and drain
(which also breaks ties between equally memory-bound options by their operations), and
nothing for the layouts a unit lists as supported (issue 25 item 3; BENCHMARKS.md)."""
from __future__ import annotations

import pytest

from torchfl.kernels.catalog import get
from torchfl.kernels.chip import ChipModel
from torchfl.kernels.tiling import Traffic, make_plan, simulated_time, vector_utilisation, TileConfig


def _conv(chip, x, w, kernel="conv2d", dtype="float16", layout=None, **attrs):
    spec = get(kernel)
    shapes = {"x": x, "weight": w}
    if kernel.startswith("conv2d_bn"):
        shapes.update({n: (w[0],) for n in ("bn_weight", "bn_bias", "running_mean", "running_var")})
    problem = spec.problem(shapes, attrs, dtype, {"x": layout}, {k: dtype for k in shapes})
    plan = spec.tile(problem, chip)
    return plan, simulated_time(plan, chip, dtype)


def test_vector_utilisation_counts_whole_vectors():
    chip = ChipModel(alignment=256)
    assert vector_utilisation(21, 2, chip) == pytest.approx(42 / 256)     # 7 taps x 3 channels, fp16
    assert vector_utilisation(128, 2, chip) == 1.0
    assert vector_utilisation(192, 2, chip) == pytest.approx(384 / 512)   # 3 x 64 channels: 1.5 vectors -> 2
    assert vector_utilisation(0, 2, chip) == 1.0
    # a wider vector never fills better (doubling the granule: ceil(n/2a)*2a >= ceil(n/a)*a)
    for n in (3, 21, 64, 96, 192, 300, 1000):
        assert vector_utilisation(n, 2, ChipModel(alignment=512)) <= vector_utilisation(n, 2, chip)


def test_pipeline_fill_and_drain():
    chip = ChipModel(peak={"float32": 1e12}, offchip_bw=1e9)
    tile = Traffic(1_000_000, 0, 500 * 10**6)          # 1 ms memory, 0.5 ms compute per tile
    one = make_plan("k", (), TileConfig("resident"), [(1, tile)], 0)
    four = make_plan("k", (), TileConfig("streamed", (), True, pipelined_tiles=True), [(4, tile)], 0)
    assert simulated_time(one, chip, "float32") == pytest.approx(1.5e-3)      # nothing overlaps
    assert simulated_time(four, chip, "float32") == pytest.approx(4e-3 + 0.5e-3)   # m + 3 max(c, m) + c
    serial = make_plan("k", (), TileConfig("streamed"), [(4, tile)], 0)      # no double buffering
    assert simulated_time(serial, chip, "float32") == pytest.approx(4 * 1.5e-3)
    # double-buffered inside its tiles (finer stages than its groups): the steady state only
    inner = make_plan("k", (), TileConfig("streamed", (), True), [(4, tile)], 0)
    assert simulated_time(inner, chip, "float32") == pytest.approx(4e-3)
    half = make_plan("k", (), TileConfig("streamed", (), True, compute_util=0.25, pipelined_tiles=True),
                     [(4, tile)], 0)
    assert simulated_time(half, chip, "float32") == pytest.approx(4 * 2e-3 + 1e-3)  # now compute-bound
    with pytest.raises(ValueError, match="compute_util"):
        make_plan("k", (), TileConfig("resident", compute_util=0.0), [(1, tile)], 0)


def test_stem_conv_fills_half_the_lanes_a_wide_conv_all(chips):
    chip = ChipModel.from_hcd(chips["NPU-V3"])
    stem, _ = _conv(chip, (1, 3, 32, 32), (64, 3, 7, 7), stride=(2, 2), padding=(3, 3))
    # reduction run 7 x 3 fp16 = 42 B, output channels 64 fp16 = 128 B of a 256 B vector: the better
    assert stem.compute_util == pytest.approx(0.5)
    assert "lanes 50% filled" in stem.config.notes and stem.as_dict()["compute_util"] == 0.5
    wide, _ = _conv(chip, (1, 256, 8, 8), (256, 256, 1, 1))
    assert wide.compute_util == 1.0 and "compute_util" not in wide.as_dict()
    # depthwise: one channel per group, the groups' channels side by side
    dw, _ = _conv(chip, (1, 128, 8, 8), (128, 1, 3, 3), padding=(1, 1), groups=128)
    assert dw.compute_util == 1.0


def test_a_wider_vector_never_makes_a_conv_cheaper(chips):
    from tests.planner.planner_helpers import hcd_variant

    base = chips["NPU-V3"]
    wide = hcd_variant(base, lambda d: d["constraints"].update(memory_alignment_bytes=1024))
    a, b = ChipModel.from_hcd(base), ChipModel.from_hcd(wide)
    for x, w, attrs in (((1, 3, 32, 32), (64, 3, 7, 7), {"stride": (2, 2), "padding": (3, 3)}),
                        ((2, 64, 16, 16), (64, 64, 3, 3), {"padding": (1, 1)}),
                        ((1, 256, 8, 8), (128, 256, 1, 1), {})):
        pa, ta = _conv(a, x, w, **attrs)
        pb, tb = _conv(b, x, w, **attrs)
        assert pb.traffic == pa.traffic and pb.compute_util <= pa.compute_util and tb >= ta


def test_memory_bound_ties_break_by_operations_not_layout(chips):
    """conv2d, conv2d_bn and conv2d_bn_relu move the same bytes; the fused epilogue's
    operations make each a little dearer (the pipeline's drain), deterministically. The
    layouts NPU-V3's fp16 unit lists as supported cost the same: the chip computes in
    each natively, and no HCD number says otherwise."""
    chip = ChipModel.from_hcd(chips["NPU-V3"])
    x, w = (2, 64, 28, 28), (256, 64, 1, 1)
    plain = _conv(chip, x, w)[1]
    bn = _conv(chip, x, w, kernel="conv2d_bn")[1]
    bn_relu = _conv(chip, x, w, kernel="conv2d_bn_relu")[1]
    assert plain < bn < bn_relu
    assert bn_relu - plain < 0.01 * plain            # a secondary term, not a new ranking
    by_layout = {lay: _conv(chip, x, w, layout=lay)[1] for lay in (None, "NHWC", "NHCW")}
    assert len(set(by_layout.values())) == 1


def test_only_weight_stationary_conv_tiles_are_pipeline_stages(chips):
    """split_c streams channel blocks inside each output tile: its stages are finer than its
    tiles, so it adds no fill/drain term (a weight-stationary conv's tiles are its stages)."""
    chip = ChipModel.from_hcd(chips["NPU-V3"]).with_cache(256 << 10)
    ws, _ = _conv(chip, (1, 64, 16, 16), (64, 64, 3, 3), padding=(1, 1))
    split, _ = _conv(chip, (1, 1024, 14, 14), (512, 1024, 3, 3), padding=(1, 1))
    assert ws.config.strategy == "weight_stationary" and ws.config.pipelined_tiles
    assert split.config.strategy == "split_c" and not split.config.pipelined_tiles
