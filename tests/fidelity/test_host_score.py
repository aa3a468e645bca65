"""``fidelity --host`` end to end, small (``--quick``): probe this host, time the quick
stand-ins of the ResNet-50 and BERT-layer ops and the plain tables, plan every row on the
probe's HCD, score, and keep the run as fidelity evidence in a real SQLite registry. One run
serves every check (it is the slowest test of the area: ~30 s of CPU)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli
from torchfl.fidelity.host import probe_version
from torchfl.registry import Registry


@pytest.fixture(scope="module")
def host_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("host")
    url = f"sqlite:///{tmp / 'reg.db'}"
    Registry(url).init(seed=True)
    out = tmp / "kept"
    r = CliRunner().invoke(cli, ["fidelity", "--host", "--quick", "--out", str(out), "--record",
                                 "--registry", url, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), out, url


def test_host_rows_plan_and_score(host_run):
    data, _out, _url = host_run
    preds = data["predictions"]
    planned = [p for p in preds if p["predicted_s"] is not None]
    # every row plans on the host's HCD but the index-taking embedding (the one-op graph is
    # built on meta tensors of the row's dtype, float for every input)
    unplanned = {p["row"]["op"] for p in preds if p["predicted_s"] is None}
    assert unplanned <= {"aten.embedding.default"}, [p["reason"] for p in preds if p["predicted_s"] is None]
    # a view's plan step is metadata (moves nothing, no launch): 0; every other call costs time
    assert all(p["predicted_s"] > 0 for p in planned if p["row"]["op"] != "aten.view.default")
    s = data["host"]["models"]
    assert s["rows"] > 20 and s["median_abs_error"] is not None and "conv" in s["families"]
    # the GEMM rows are predicted from the probe's own GEMM peak: the right order of magnitude
    mm = [p for p in planned if p["row"]["op"] == "aten.mm.default"]
    assert mm and all(0.2 < p["predicted_s"] / p["measured_s"] < 5 for p in mm)
    assert data["scores"]


def test_host_run_is_kept_and_recorded(host_run):
    data, out, url = host_run
    assert sorted(p.suffix for p in out.iterdir()) == [".csv", ".csv", ".hcd"]
    assert data["host"]["hcd"].endswith(".hcd")
    (chip,) = data["recorded_runs"]
    from torchfl.registry.fidelity import fidelity_runs

    with Registry(url) as reg:
        (run,) = fidelity_runs(reg, chip=chip)
        # the probe's HCD was imported under a version naming its numbers
        assert reg.chip(chip).chip.version.startswith("1.0.0+")


def test_probe_version_names_the_numbers():
    from torchfl.fidelity.probe import probe

    text = probe("cpu", threads=1, quick=True).hcd_text()
    assert probe_version(text) == probe_version(text.replace("version: 1.0.0", "version: 9.9.9"))
    assert probe_version(text) != probe_version(text.replace("peak_tflops: ", "peak_tflops: 1", 1))


def test_cli_host_argument_errors():
    r = CliRunner().invoke(cli, ["fidelity", "--host", "--table", "x.csv"])
    assert r.exit_code == 2 and "leave --table and --chip out" in r.output
    r = CliRunner().invoke(cli, ["fidelity", "--quick"])
    assert r.exit_code == 2 and "go with --host" in r.output
