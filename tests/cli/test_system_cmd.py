"""``torchfl system validate|import|list|show|history`` on a real SQLite registry file."""

from __future__ import annotations

import json

from click.testing import CliRunner

from torchfl.cli.main import cli
from torchfl.resources import bundled_path

SYSTEMS = bundled_path("hcd_registry") / "systems"


def _run(*args):
    return CliRunner().invoke(cli, ["system", *args])


def test_validate_import_list_show_history(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.sqlite3'}"
    assert CliRunner().invoke(cli, ["registry", "init", "--no-seed", "--registry", url]).exit_code == 0
    h100 = str(bundled_path("hcd_registry") / "h100_sxm5_80gb.hcd")
    hgx = str(SYSTEMS / "hgx_h100_8.system.yaml")
    res = _run("validate", hgx, "--registry", url)                 # the chip is not imported yet
    assert res.exit_code == 1 and ":11:9: error: chips.name: unknown chip 'H100-SXM5-80GB'" in res.output
    assert _run("validate", "--offline", hgx).exit_code == 0
    res = _run("import", hgx, "--registry", url)
    assert res.exit_code == 1 and "unknown chip" in res.output and "left as it was" in res.output
    res = _run("import", h100, hgx, "--registry", url)
    assert res.exit_code == 0, res.output
    assert "added     system HGX-H100-8 1.0.0" in res.output
    assert _run("validate", hgx, "--registry", url).output.strip().endswith(
        "hgx_h100_8.system.yaml: valid: HGX-H100-8 1.0.0")
    listed = json.loads(_run("list", "--registry", url, "--json").stdout)["systems"]
    assert [(s["name"], s["chip"], s["count"]) for s in listed] == [("HGX-H100-8", "H100-SXM5-80GB", 8)]
    assert "8x H100-SXM5-80GB" in _run("list", "--registry", url).output
    shown = json.loads(_run("show", "HGX-H100-8", "--registry", url, "--json").stdout)
    assert shown["links"]["interconnect.links.count"] == {"value": 18.0, "from": "chip", "kind": "datasheet"}
    text = _run("show", "HGX-H100-8", "--registry", url).output
    assert text.startswith("# system HGX-H100-8 1.0.0: 8x H100-SXM5-80GB") and "link numbers the planner" in text
    hist = json.loads(_run("history", "HGX-H100-8", "--registry", url, "--json").stdout)
    assert [v["version"] for v in hist["versions"]] == ["1.0.0"]
    res = _run("history", "HGX-H100", "--registry", url)
    assert res.exit_code == 1 and "did you mean HGX-H100-8" in res.output


def test_validate_reports_every_problem_located(tmp_path):
    bad = tmp_path / "bad.system.yaml"
    bad.write_text((SYSTEMS / "hgx_h100_8.system.yaml").read_text().replace("count: 8", "count: 12")
                   .replace("  fabric: nvswitch", "  fabrik: nvswitch"))
    res = _run("validate", "--offline", str(bad))
    assert res.exit_code == 1
    assert f"{bad}:15:3: error: topology.fabrik: unknown field 'fabrik'; did you mean 'fabric'?" in res.output
    assert f"{bad}:16:17: error: topology.domain_chips: 12 chips (chips.count) do not fill fabric domains of 8" \
        in res.output
    assert _run("validate", str(tmp_path / "none.system.yaml"), "--offline").exit_code == 2


def test_schema_is_the_models():
    schema = json.loads(_run("schema").stdout)
    assert schema["$id"].endswith("system-v1.json")
    assert set(schema["required"]) == {"system", "chips", "topology"}
    topo = schema["$defs"]["Topology"]["properties"]["kind"]
    assert topo["enum"] == ["all-to-all", "ring", "torus-2d", "torus-3d", "mesh-2d"]


def test_diff_of_two_versions(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.sqlite3'}"
    assert CliRunner().invoke(cli, ["registry", "init", "--registry", url]).exit_code == 0
    newer = tmp_path / "npu.system.yaml"
    newer.write_text((SYSTEMS / "npu_v3_board4.system.yaml").read_text().replace("version: 1.0.0", "version: 1.1.0")
                     .replace("bandwidth_gb_per_s: 50", "bandwidth_gb_per_s: 40"))
    assert _run("import", str(newer), "--registry", url).exit_code == 0
    res = _run("diff", "NPU-V3-BOARD4", "1.0.0", "1.1.0", "--registry", url)
    assert res.exit_code == 0 and "2 change(s)" in res.output
    assert "interconnect.links.bandwidth_gb_per_s: 50.0 -> 40.0" in res.output
