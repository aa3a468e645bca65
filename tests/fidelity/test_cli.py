"""``torchfl fidelity`` end to end on a small real table, recording evidence that ``plan
explain`` then reports; bad tables and chips are one-line errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli

TABLE = """# three published rows (LLMCompass artifact, BSD-3-Clause; see measurements/)
chip,op,shapes,dtype,args,seconds,source
A100-SXM4-80GB,matmul,8192x4096;4096x4096,bfloat16,,0.001021,llmcompass-ae
A100-SXM4-80GB,softmax,4096x1024,float16,,2.74e-05,llmcompass-ae
NO-SUCH-CHIP,softmax,4096x1024,float16,,2.74e-05,x
"""


@pytest.fixture
def url(tmp_path):
    from torchfl.registry import Registry
    from torchfl.resources import bundled_path

    u = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(u) as reg:
        reg.init()
        reg.import_files([bundled_path("hcd_registry") / "a100_sxm4_80gb.hcd", *bundled_path("rules").glob("*.yaml")])
    return u


def test_fidelity_scores_records_and_explain_reports(tmp_path, url):
    table = tmp_path / "t.csv"
    table.write_text(TABLE)
    run = CliRunner().invoke(cli, ["fidelity", "--table", str(table), "--json", "--record", "--registry", url])
    assert run.exit_code == 0, run.output
    out = json.loads(run.stdout)
    (mm, sm, al) = [s for s in out["scores"] if s["chip"] == "A100-SXM4-80GB"]
    assert (mm["family"], sm["family"], al["family"], al["rows"]) == ("matmul", "softmax", "all", 2)
    missing = [p for p in out["predictions"] if p["chip"] == "NO-SUCH-CHIP"]
    assert missing[0]["predicted_s"] is None and "NO-SUCH-CHIP" in missing[0]["reason"]
    assert set(out["recorded_runs"]) == {"A100-SXM4-80GB"}
    text = CliRunner().invoke(cli, ["plan", "explain", "mlp", "--chip", "A100-SXM4-80GB", "--registry", url])
    assert text.exit_code == 0, text.output
    assert "Fidelity: A100-SXM4-80GB: predictions checked on 2 published measurements, mean error" in \
        " ".join(text.output.split())


def test_text_report_names_the_worst_rows(tmp_path, url):
    table = tmp_path / "t.csv"
    table.write_text(TABLE)
    run = CliRunner().invoke(cli, ["fidelity", "--table", str(table), "--chip", "A100-SXM4-80GB", "--registry", url])
    assert run.exit_code == 0, run.output
    assert "worst A100-SXM4-80GB softmax:" in run.output and "t.csv:4: softmax 4096x1024 float16" in run.output


def test_bad_table_and_unknown_chip_are_one_line_errors(tmp_path, url):
    bad = tmp_path / "bad.csv"
    bad.write_text("chip,op,shapes,dtype,args,seconds,source\nA,matmul,8x8;8x8,float16,,-1,s\n")
    run = CliRunner().invoke(cli, ["fidelity", "--table", str(bad), "--registry", url])
    assert run.exit_code == 2 and f"error: {bad}:2: seconds:" in run.output
    table = tmp_path / "t.csv"
    table.write_text(TABLE)
    run = CliRunner().invoke(cli, ["fidelity", "--table", str(table), "--chip", "A100", "--registry", url])
    assert run.exit_code == 1 and "no row of the tables is for chip 'A100'" in run.output
    assert "Traceback" not in run.output
