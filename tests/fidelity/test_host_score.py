"""``fidelity --host`` end to end, small: probe this host, time the quick stand-ins of the
ResNet-50 and BERT-layer ops and the plain tables, plan every row on the probe's HCD, score,
and keep the run as fidelity evidence in a real SQLite registry."""
from __future__ import annotations

import pytest

from torchfl.fidelity.host import probe_version, run_host, score_host
from torchfl.registry import Registry


@pytest.fixture(scope="module")
def quick_run():
    return run_host(threads=1, quick=True)


def test_host_rows_plan_and_score(quick_run, tmp_path):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    Registry(url).init(seed=True)
    res = score_host(quick_run, tmp_path / "out", record=True, registry=url)
    preds = res.result.predictions
    assert len(preds) == len(quick_run.rows)
    planned = [p for p in preds if p.predicted_s is not None]
    # every row plans on the host's HCD but the index-taking embedding (the one-op graph is
    # built on meta tensors of the row's dtype, float for every input)
    unplanned = {p.row.op for p in preds if p.predicted_s is None}
    assert unplanned <= {"aten.embedding.default"}, [p.reason for p in preds if p.predicted_s is None]
    # a view's plan step is metadata (moves nothing, no launch): 0; every other call costs time
    assert all(p.predicted_s > 0 for p in planned if p.row.op != "aten.view.default")
    s = res.models_summary
    assert s["rows"] + s["unplanned"] == len(quick_run.models.rows)
    assert s["median_abs_error"] is not None and "conv" in s["families"]
    # the GEMM rows are predicted from the probe's own GEMM peak: the right order of magnitude
    mm = [p for p in planned if p.row.op == "aten.mm.default"]
    assert mm and all(0.2 < p.predicted_s / p.row.seconds < 5 for p in mm)
    # the run is evidence: the probe's HCD was imported under a version naming its numbers
    chip = quick_run.probe.chip_name()
    assert list(res.runs) == [chip]
    from torchfl.registry.fidelity import fidelity_runs

    with Registry(url) as reg:
        (run,) = fidelity_runs(reg, chip=chip)
        assert reg.chip(chip).chip.version.startswith("1.0.0+")


def test_probe_version_names_the_numbers(quick_run):
    text = quick_run.probe.hcd_text()
    assert probe_version(text) == probe_version(text.replace("version: 1.0.0", "version: 9.9.9"))
    assert probe_version(text) != probe_version(text.replace("peak_tflops: ", "peak_tflops: 1", 1))


def test_cli_host_quick_prints_scores_and_keeps_the_files(tmp_path):
    import json

    from click.testing import CliRunner

    from torchfl.cli.main import cli

    out = tmp_path / "kept"
    r = CliRunner().invoke(cli, ["fidelity", "--host", "--quick", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["host"]["models"]["rows"] > 20 and data["scores"]
    assert sorted(p.suffix for p in out.iterdir()) == [".csv", ".csv", ".hcd"]
    assert data["host"]["hcd"].endswith(".hcd")


def test_cli_host_argument_errors():
    from click.testing import CliRunner

    from torchfl.cli.main import cli

    r = CliRunner().invoke(cli, ["fidelity", "--host", "--table", "x.csv"])
    assert r.exit_code == 2 and "leave --table and --chip out" in r.output
    r = CliRunner().invoke(cli, ["fidelity", "--quick"])
    assert r.exit_code == 2 and "go with --host" in r.output
