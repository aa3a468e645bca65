"""``torchfl hcd`` as a user runs it: real subprocesses, exit codes, JSON shapes, schema."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
import yaml

from torchfl.resources import bundled_hcds

SEEDS_DIR = "/work/shared/hcd-examples"


def torchfl(*args, **kw):
    return subprocess.run([sys.executable, "-m", "torchfl.cli", *args], capture_output=True, text=True, **kw)


def test_bundled_chips_validate():
    result = torchfl("hcd", "validate", *map(str, bundled_hcds()))
    assert result.returncode == 0, result.stderr
    assert len(bundled_hcds()) >= 6
    assert result.stdout.count(": valid:") == len(bundled_hcds())
    assert "Traceback" not in result.stdout + result.stderr


def test_seed_files_match_the_article_reconstruction():
    from pathlib import Path

    seeds = Path(SEEDS_DIR)
    if not seeds.is_dir():
        pytest.skip("shared/ seed folder not present")
    for seed in seeds.glob("*.hcd"):
        bundled = next(p for p in bundled_hcds() if p.name == seed.name)
        assert bundled.read_text() == seed.read_text(), f"{bundled} differs from the seed"


def test_seed_warnings_are_only_the_spec_ones():
    v2 = next(p for p in bundled_hcds() if p.name == "npu_v2.hcd")
    result = torchfl("hcd", "validate", "--json", str(v2))
    assert result.returncode == 0
    diags = json.loads(result.stdout)
    assert {d["severity"] for d in diags} == {"warning"}
    assert sorted(d["path"] for d in diags) == [
        "compute_units.fp16.peak_gflops", "compute_units.int8.peak_gops", "tensor.supported_dtypes[2]"]
    assert set(diags[0]) == {"file", "line", "column", "path", "severity", "message"}


def test_exit_codes(tmp_path):
    bad = tmp_path / "bad.hcd"
    bad.write_text("chip: {name: X}\n")
    good = str(bundled_hcds()[0])
    assert torchfl("hcd", "validate", good).returncode == 0
    invalid = torchfl("hcd", "validate", good, str(bad))
    assert invalid.returncode == 1
    assert "bad.hcd:1:1: error: chip.vendor: required field 'vendor' is missing" in invalid.stderr
    unreadable = torchfl("hcd", "validate", str(bad), str(tmp_path / "nope.hcd"))
    assert unreadable.returncode == 2
    assert "Traceback" not in unreadable.stderr


def test_json_diagnostics_of_invalid_file(tmp_path):
    bad = tmp_path / "bad.hcd"
    bad.write_text(bundled_hcds()[0].read_text().replace("memory_alignment_bytes: ", "memory_alignment_bytes: 3"))
    result = torchfl("hcd", "validate", "--json", str(bad))
    assert result.returncode == 1
    errors = [d for d in json.loads(result.stdout) if d["severity"] == "error"]
    assert len(errors) == 1 and errors[0]["path"] == "constraints.memory_alignment_bytes"


def test_schema_is_draft_2020_12_and_seeds_validate():
    result = torchfl("hcd", "schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in bundled_hcds():
        errors = list(validator.iter_errors(yaml.safe_load(path.read_text())))
        assert errors == [], (path, [e.message for e in errors])
    broken = yaml.safe_load(bundled_hcds()[0].read_text())
    broken["tensor"]["default_layout"] = "nchw"
    assert list(validator.iter_errors(broken))


def test_show_json_is_canonical():
    v3 = next(p for p in bundled_hcds() if p.name == "npu_v3.hcd")
    result = torchfl("hcd", "show", "--json", str(v3))
    assert result.returncode == 0
    shown = json.loads(result.stdout)
    assert shown["compute_units"]["fp16"]["peak_tflops"] == 25.6
    assert "peak_gflops" not in result.stdout
    assert len(shown["content_hash"]) == 64
    table = torchfl("hcd", "show", str(v3))
    assert "25.6 TFLOPS" in table.stdout


def test_cli_does_not_import_torch_or_numba():
    code = ("import sys; from torchfl.cli.main import cli; from torchfl.hcd import check_hcd; "
            f"check_hcd({str(bundled_hcds()[0])!r}); "
            "bad = [m for m in ('torch', 'numba') if m in sys.modules]; print(bad)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
