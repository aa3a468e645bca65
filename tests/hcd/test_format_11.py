"""HCD format 1.1: the optional sustained fractions and the ``execution`` section validate,
are located when wrong, reach the ChipModel, and leave a 1.0 file's hash alone."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from torchfl.hcd import check_hcd_text, load_hcd, load_hcd_text
from torchfl.resources import bundled_path

SEED = (bundled_path("hcd_registry") / "npu_v3.hcd").read_text()

EXTRA = """\
execution:
  launch_overhead_us: 4.5       # measured
  concurrent_tiles: 108
  tile_elements: 16384
"""

# the content hashes of the bundled 1.0 chips before format 1.1 existed (main 0fd8e39)
HASHES_10 = {
    "npu_v3.hcd": "ab6bd6b896bf",
    "npu_v2.hcd": "57bfa8264a5c",
    "dsp_m4.hcd": "5b9a93780d04",
    "edge_c2.hcd": "1b10d932f09d",
    "npu_e1.hcd": "4f934dd534df",
    "tfl_x1.hcd": "58ed6ce9e2f2",
}


def v11(text: str = SEED, *, fp16_sf="0.9", mem_sf="0.8", extra=EXTRA) -> str:
    text = text.replace("    peak_gflops: 25.6          # TFLOPS, per the article",
                        f"    peak_gflops: 25.6          # TFLOPS, per the article\n    sustained_fraction: {fp16_sf}")
    text = text.replace("    bandwidth_gb_per_s: 128\n", f"    bandwidth_gb_per_s: 128\n    sustained_fraction: {mem_sf}\n")
    return text + extra


def errors(text):
    return [d for d in check_hcd_text(text, "chip.hcd").diagnostics if d.severity == "error"]


def test_a_11_file_validates_and_reaches_the_chip_model():
    from torchfl.kernels.chip import ChipModel

    hcd = load_hcd_text(v11())
    assert hcd.format_version == "1.1"
    assert hcd.compute_units.fp16.sustained_fraction == 0.9
    assert hcd.memory.off_chip_memory.sustained_fraction == 0.8
    assert hcd.execution.launch_overhead_us == 4.5
    assert hcd.sustained_fraction("float16") == 0.9 and hcd.sustained_fraction("int8") == 1.0
    chip = ChipModel.from_hcd(hcd)
    assert chip.launch_s == pytest.approx(4.5e-6)
    assert chip.sustained == {"float16": 0.9, "bfloat16": 0.9}   # bf16 runs on the fp16 unit here
    assert chip.offchip_sustained == 0.8
    assert (chip.concurrent_tiles, chip.tile_elements) == (108, 16384)
    assert chip.sustained_for("int8") == 1.0


def test_bundled_10_files_keep_their_hash_and_version():
    from torchfl.resources import bundled_hcds

    seen = {}
    for path in bundled_hcds():
        if path.name in HASHES_10:
            hcd = load_hcd(path)
            seen[path.name] = hcd.content_hash()[:12]
            assert hcd.format_version == "1.0"
            assert "execution" not in hcd.canonical()
    assert seen == HASHES_10


def test_11_fields_change_the_hash():
    assert load_hcd_text(v11()).content_hash() != load_hcd_text(SEED).content_hash()


@pytest.mark.parametrize("edit, where, words", [
    (dict(fp16_sf="1.5"), (11, 25), "must be <= 1"),
    (dict(fp16_sf="0"), (11, 25), "must be >= 0.001"),
    (dict(mem_sf="-0.1"), (26, 25), "must be >= 0.001"),
    (dict(mem_sf='"high"'), (26, 25), "expected a number"),
    (dict(extra="execution:\n  launch_overhead_us: -1\n"), (39, 23), "must be >= 0"),
    (dict(extra="execution:\n  concurrent_tiles: 1.5\n  tile_elements: 64\n"), (39, 21), "integer"),
    (dict(extra="execution:\n  tile_elements: 16384\n"), (39, 3), "needs execution.concurrent_tiles"),
    (dict(extra="execution:\n  launch_overhead: 3\n"), (39, 3), "did you mean 'launch_overhead_us'"),
])
def test_bad_11_fields_are_located(edit, where, words):
    found = errors(v11(**edit))
    assert len(found) == 1, [str(d) for d in found]
    d = found[0]
    assert (d.line, d.column) == where, str(d)
    assert words in d.message, str(d)


def test_concurrent_tiles_alone_warns_that_waves_are_off():
    report = check_hcd_text(v11(extra="execution:\n  concurrent_tiles: 108\n"), "chip.hcd")
    assert report.ok
    (w,) = [d for d in report.diagnostics if "waves are not modelled" in d.message]
    assert w.severity == "warning" and w.path == "execution.concurrent_tiles"
    from torchfl.kernels.chip import ChipModel

    assert ChipModel.from_hcd(report.hcd).concurrent_tiles == 0


def test_schema_documents_every_11_field_with_its_unit():
    from torchfl.hcd.schema import hcd_json_schema

    defs = hcd_json_schema()["$defs"]
    ex = defs["Execution"]["properties"]
    assert "microseconds" in ex["launch_overhead_us"]["description"]
    assert "integer" in ex["concurrent_tiles"]["description"]
    assert "elements" in ex["tile_elements"]["description"]
    for unit in ("FloatUnit", "IntUnit", "OffChipMemory"):
        desc = defs[unit]["properties"]["sustained_fraction"]["anyOf"][0]
        assert desc.get("minimum") == 0.001 and desc.get("maximum") == 1   # issue 52: a floor
        assert "Dimensionless" in defs[unit]["properties"]["sustained_fraction"]["description"]


def test_hcd_show_prints_the_11_fields(tmp_path):
    from torchfl.cli.main import cli

    path = tmp_path / "chip.hcd"
    path.write_text(v11())
    out = CliRunner().invoke(cli, ["hcd", "show", str(path)], env={"COLUMNS": "220"})
    assert out.exit_code == 0, out.output
    assert "format 1.1" in out.output
    assert "4.5 us per kernel launch" in out.output
    assert "90.0% of peak sustained" in out.output
    assert "108 tiles at once" in out.output
    js = json.loads(CliRunner().invoke(cli, ["hcd", "show", str(path), "--json"]).output)
    assert js["execution"]["tile_elements"] == 16384 and js["format_version"] == "1.1"


def test_registry_diff_names_the_11_fields_and_their_units():
    from torchfl.registry.diff import diff

    old = load_hcd_text(SEED).canonical()
    new = load_hcd_text(v11()).canonical()
    text = [str(c) for c in diff(old, new)]
    assert "+ execution.launch_overhead_us: 4.5 (us)" in text
    assert "+ compute_units.fp16.sustained_fraction: 0.9 (fraction of peak)" in text
