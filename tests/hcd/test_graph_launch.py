"""HCD 1.1 ``execution.graph_launch_overhead_us``: the per-kernel cost when a whole plan is
submitted as one graph. It validates, is located when wrong, reaches the ChipModel, and changes
nothing unless a prediction asks for graph submission (every eager price stays as it was)."""

from __future__ import annotations

import pytest

from torchfl.hcd import check_hcd_text, load_hcd, load_hcd_text
from torchfl.kernels.chip import ChipModel
from torchfl.kernels.tiling import TileConfig, Traffic, make_plan, time_terms
from torchfl.resources import bundled_path

SEED = (bundled_path("hcd_registry") / "npu_v3.hcd").read_text()
EAGER = "execution:\n  launch_overhead_us: 12\n  matrix_launch_overhead_us: 21\n"
GRAPH = EAGER + "  graph_launch_overhead_us: 0.58\n"


def _matmul_plan(chip=None):
    """A one-tile plan of the matmul kernel (a matrix family: the matrix launch applies eagerly)."""
    return make_plan("matmul", (), TileConfig("resident"), ((1, Traffic(10**6, 0, 0)),), 0)


def test_field_validates_and_reaches_the_chip_model():
    hcd = load_hcd_text(SEED + GRAPH)
    assert hcd.execution.graph_launch_overhead_us == 0.58 and hcd.format_version == "1.1"
    chip = ChipModel.from_hcd(hcd)
    assert chip.graph_launch_s == pytest.approx(0.58e-6) and chip.submission == "eager"
    assert ChipModel.from_hcd(load_hcd_text(SEED + EAGER)).graph_launch_s is None


def test_negative_value_is_located():
    errs = [d for d in check_hcd_text(SEED + EAGER + "  graph_launch_overhead_us: -1\n", "c.hcd").diagnostics
            if d.severity == "error"]
    assert errs and errs[0].path == "execution.graph_launch_overhead_us"


def test_eager_prices_are_unchanged_by_the_field():
    """A file stating the graph cost predicts every eager plan exactly as without it."""
    with_field = ChipModel.from_hcd(load_hcd_text(SEED + GRAPH))
    without = ChipModel.from_hcd(load_hcd_text(SEED + EAGER))
    for kernel in ("", "matmul"):
        assert with_field.launch_for(kernel) == without.launch_for(kernel)
    a, b = time_terms(_matmul_plan(with_field), with_field, "float16"), time_terms(_matmul_plan(without), without,
                                                                                     "float16")
    assert a.total_s == b.total_s and a.launch_s == pytest.approx(21e-6)


def test_graph_submission_prices_every_kernel_at_the_graph_cost():
    chip = ChipModel.from_hcd(load_hcd_text(SEED + GRAPH))
    graph = chip.submitted("graph")
    assert graph.hcd_hash == chip.hcd_hash and hash(graph) != hash(chip)   # same chip, other price caches
    eager_t, graph_t = time_terms(_matmul_plan(chip), chip, "float16"), time_terms(_matmul_plan(graph), graph,
                                                                                     "float16")
    assert graph_t.launch_s == pytest.approx(0.58e-6)
    assert eager_t.total_s - graph_t.total_s == pytest.approx(21e-6 - 0.58e-6)
    assert graph.launch_for("") == pytest.approx(0.58e-6)
    assert graph.submitted("eager").launch_for("") == pytest.approx(12e-6)


def test_graph_submission_without_the_field_keeps_the_eager_costs():
    chip = ChipModel.from_hcd(load_hcd_text(SEED + EAGER))
    graph = chip.submitted("graph")
    assert not graph.graph_priced and graph.launch_for("") == chip.launch_for("")


def test_unknown_submission_is_refused_with_the_choices():
    chip = ChipModel.from_hcd(load_hcd_text(SEED + GRAPH))
    with pytest.raises(ValueError, match="eager, graph"):
        chip.submitted("batched")


def test_schema_documents_the_field_with_its_unit():
    from torchfl.hcd.schema import hcd_json_schema

    ex = hcd_json_schema()["$defs"]["Execution"]["properties"]["graph_launch_overhead_us"]
    assert "microseconds" in ex["description"] and "graph" in ex["description"]


@pytest.mark.parametrize("name", ["a100_sxm4_80gb.hcd", "h100_sxm5_80gb.hcd"])
def test_bundled_nvidia_chips_state_it_with_its_source(name):
    path = bundled_path("hcd_registry") / name
    hcd = load_hcd(path)
    assert hcd.execution.graph_launch_overhead_us == 0.58
    text = path.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("  graph_launch_overhead_us:"))
    assert "[GL]" in line and "https://github.com/ahrefs/ocannl/issues/488" in text


def test_hcd_show_and_registry_diff_name_the_field(tmp_path):
    """What a user reads: `hcd show` prints the graph launch cost beside the eager ones, and a
    registry diff gives its unit like the other execution fields."""
    from click.testing import CliRunner

    from torchfl.cli.main import cli
    from torchfl.registry.diff import diff

    path = tmp_path / "chip.hcd"
    path.write_text(SEED + GRAPH)
    out = CliRunner().invoke(cli, ["hcd", "show", str(path)], env={"COLUMNS": "240"})
    assert out.exit_code == 0, out.output
    assert "0.58 us per kernel in a submitted graph" in out.output
    text = [str(c) for c in diff(load_hcd_text(SEED + EAGER).canonical(), load_hcd_text(SEED + GRAPH).canonical())]
    assert "+ execution.graph_launch_overhead_us: 0.58 (us)" in text
