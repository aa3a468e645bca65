"""list / show / history / diff through the CLI (text and --json), on both backends."""

from __future__ import annotations

import json

import pytest
from tests.registry.registry_gen import hcd_text, write_hcds


@pytest.fixture
def two_versions(reg, tmp_path):
    files = write_hcds(tmp_path, [
        ("x1.hcd", hcd_text("X-1", "1.0.0", alignment=256)),
        ("x2.hcd", hcd_text("X-1", "1.1.0", alignment=512, cache_kb=8192)),
        ("y.hcd", hcd_text("Y-2", "2.0.0")),
    ])
    reg.import_files(files)
    return files


def test_import_cli_json_and_text(cli, reg, tmp_path):
    files = write_hcds(tmp_path, [("a.hcd", hcd_text("A-1")), ("b.hcd", hcd_text("B-1"))])
    r = cli("import", *files, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["ok"] and data["added"] == 2 and {i["status"] for i in data["imported"]} == {"added"}
    r = cli("import", *files)
    assert r.exit_code == 0 and "0 added, 2 unchanged" in r.stdout
    assert r.stdout.count("unchanged chip") == 2


def test_import_cli_refusals_exit_1_with_located_errors(cli, reg, tmp_path):
    (a,) = write_hcds(tmp_path / "1", [("a.hcd", hcd_text("A-1"))])
    (b,) = write_hcds(tmp_path / "2", [("a.hcd", hcd_text("A-1", alignment=512))])
    (bad,) = write_hcds(tmp_path, [("bad.hcd", hcd_text("BAD-1", alignment=3))])
    assert cli("import", a).exit_code == 0
    r = cli("import", b)
    assert r.exit_code == 1 and "bump chip.version" in r.stderr and "sha256:" in r.stderr
    r = cli("import", bad, "--json")
    assert r.exit_code == 1
    data = json.loads(r.stdout)
    assert not data["ok"] and data["diagnostics"][0]["file"] == bad and data["diagnostics"][0]["line"] > 1
    r = cli("import", bad)
    assert r.exit_code == 1 and f"{bad}:" in r.stderr and "left as it was" in r.stderr


def test_list(cli, two_versions):
    r = cli("list", "--json")
    assert r.exit_code == 0
    chips = json.loads(r.stdout)["chips"]
    assert [(c["name"], c["latest"], c["versions"]) for c in chips] == [
        ("X-1", "1.1.0", ["1.0.0", "1.1.0"]), ("Y-2", "2.0.0", ["2.0.0"])]
    text = cli("list").stdout
    assert "X-1" in text and "1.1.0" in text and "Y-2" in text


def test_show_latest_and_version(cli, two_versions):
    data = json.loads(cli("show", "X-1", "--json").stdout)
    assert data["version"] == "1.1.0" and data["canonical"]["constraints"]["memory_alignment_bytes"] == 512
    assert len(data["content_hash"]) == 64 and data["imported_at"].endswith("+00:00")
    old = json.loads(cli("show", "X-1", "--version", "1.0.0", "--json").stdout)
    assert old["canonical"]["constraints"]["memory_alignment_bytes"] == 256
    text = cli("show", "X-1").stdout
    assert f"sha256:{data['content_hash']}" in text and "memory_alignment_bytes: 512" in text
    assert cli("show", "X-1", "--source").stdout.startswith("# chip X-1 1.1.0")
    r = cli("show", "X-1", "--version", "9.9.9")
    assert r.exit_code == 1 and "has no version 9.9.9" in r.stderr and "1.0.0, 1.1.0" in r.stderr
    r = cli("show", "X-2")
    assert r.exit_code == 1 and "did you mean" in r.stderr and "X-1" in r.stderr


def test_history(cli, two_versions):
    data = json.loads(cli("history", "X-1", "--json").stdout)
    assert [v["version"] for v in data["versions"]] == ["1.0.0", "1.1.0"]
    assert all(len(v["content_hash"]) == 64 and v["imported_at"] for v in data["versions"])
    assert "1.1.0" in cli("history", "X-1").stdout


def test_diff_field_level(cli, two_versions):
    r = cli("diff", "X-1", "1.0.0", "1.1.0")
    assert r.exit_code == 0
    assert "constraints.memory_alignment_bytes: 256 -> 512" in r.stdout
    assert "memory.on_chip_cache.size_kb: 4096 -> 8192" in r.stdout
    assert "chip.version: \"1.0.0\" -> \"1.1.0\"" in r.stdout
    data = json.loads(cli("diff", "X-1", "1.0.0", "1.1.0", "--json").stdout)
    assert {c["path"]: (c["kind"], c["old"], c["new"]) for c in data["changes"]} == {
        "chip.version": ("changed", "1.0.0", "1.1.0"),
        "constraints.memory_alignment_bytes": ("changed", 256, 512),
        "memory.on_chip_cache.size_kb": ("changed", 4096, 8192),
    }


def test_diff_added_and_removed_fields(reg):
    base = hcd_text("Z-1", "1.0.0")
    more = hcd_text("Z-1", "2.0.0").replace("    bandwidth_gb_per_s: 64\n",
                                             "    bandwidth_gb_per_s: 64\n    size_gb: 16\n")
    less = hcd_text("Z-1", "3.0.0").replace("  attention:\n    enabled: true\n    max_sequence_length: 2048\n"
                                            "    supported_heads: [1, 2, 4, 8]\n", "")
    reg.import_texts([("a.hcd", base), ("b.hcd", more), ("c.hcd", less)])
    added = {c.path: c for c in reg.diff("Z-1", "1.0.0", "2.0.0")}
    assert added["memory.off_chip_memory.size_gb"].kind == "added" and added["memory.off_chip_memory.size_gb"].new == 16
    assert str(added["memory.off_chip_memory.size_gb"]) == "+ memory.off_chip_memory.size_gb: 16.0"
    removed = {c.path: c for c in reg.diff("Z-1", "1.0.0", "3.0.0")}
    assert {p for p, c in removed.items() if c.kind == "removed"} == {
        "compute_units.attention.enabled", "compute_units.attention.max_sequence_length",
        "compute_units.attention.supported_heads"}
    assert reg.diff("Z-1", "1.0.0", "1.0.0") == []


def test_import_a_directory_and_subcommand_registry_option(registry_url, reg, tmp_path):
    from click.testing import CliRunner

    from torchfl.cli.main import cli as root

    write_hcds(tmp_path / "chips", [("a.hcd", hcd_text("A-1")), ("b.hcd", hcd_text("B-1"))])
    (tmp_path / "chips" / "README.txt").write_text("not imported")
    runner = CliRunner()
    r = runner.invoke(root, ["registry", "import", str(tmp_path / "chips"), "--registry", registry_url, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["added"] == 2
    r = runner.invoke(root, ["registry", "list", "--json"], env={"TORCHFL_REGISTRY_URL": registry_url})
    assert [c["name"] for c in json.loads(r.stdout)["chips"]] == ["A-1", "B-1"]
