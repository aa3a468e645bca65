"""``plan decode|memory|compare`` with ``--system``: a system resolves to the chips and links
``--chips`` gives (the same plan), its overrides win, and the answer's first line names it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli

TWO_H100 = """\
system:
  name: TWO-H100
  version: 1.0.0
chips:
  name: H100-SXM5-80GB
  count: 2
topology:
  kind: all-to-all
  domain_chips: 2
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('reg') / 'r.sqlite3'}"
    assert CliRunner().invoke(cli, ["registry", "init", "--registry", url]).exit_code == 0
    return url


def _decode(url, *args):
    res = CliRunner().invoke(cli, ["plan", "decode", "tiny-llama", "--context", "64", "--prompt", "8", "--tp", "2",
                                   "--registry", url, *args])
    assert res.exit_code == 0, res.output
    return res


def test_system_file_equals_chips_shorthand(url, tmp_path):
    path = tmp_path / "two.system.yaml"
    path.write_text(TWO_H100)
    by_system = json.loads(_decode(url, "--system", str(path), "--json").stdout)
    by_chips = json.loads(_decode(url, "--chips", "2xH100-SXM5-80GB", "--json").stdout)
    assert by_system["system"]["name"] == "TWO-H100" and "system" not in by_chips
    for key in ("decode_s", "prefill_s", "collective_s", "peak_bytes", "all_reduces"):
        assert by_system["rows"][0][key] == by_chips["rows"][0][key], key
    assert by_system["bus_gb_per_s"] == by_chips["bus_gb_per_s"]
    first = _decode(url, "--system", str(path)).output.splitlines()[0]
    assert first.startswith("tiny-llama on system TWO-H100 1.0.0: 2x H100-SXM5-80GB")


def test_system_overrides_win(url, tmp_path):
    slow = tmp_path / "slow.system.yaml"
    slow.write_text(TWO_H100 + "interconnect:\n  links:\n    bandwidth_gb_per_s: 1\n  latency_us: 50\n")
    base = json.loads(_decode(url, "--chips", "2xH100-SXM5-80GB", "--json").stdout)
    mine = json.loads(_decode(url, "--system", str(slow), "--json").stdout)
    assert mine["bus_gb_per_s"] == pytest.approx(base["bus_gb_per_s"] / 25)
    assert mine["rows"][0]["collective_s"] > base["rows"][0]["collective_s"]


def test_bundled_system_by_name_and_a_chip_without_links(url):
    data = json.loads(_decode(url, "--system", "NPU-V3-BOARD4", "--json").stdout)
    assert data["ok"] and data["fabric"] == "ici" and data["chips"] == 4
    assert data["system"]["describe"].startswith("system NPU-V3-BOARD4 1.0.0: 4x NPU-V3")
    res = CliRunner().invoke(cli, ["plan", "memory", "tiny-llama", "--system", "HGX-H100-8", "--context", "64",
                                   "--tp", "4", "--pp", "2", "--registry", url])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("tiny-llama on system HGX-H100-8 1.0.0: 8x H100-SXM5-80GB")


def test_one_line_refusals(url, tmp_path):
    bad = tmp_path / "bad.system.yaml"
    bad.write_text(TWO_H100.replace("H100-SXM5-80GB", "H100-SXM5-80G"))
    nodes = tmp_path / "nodes.system.yaml"
    nodes.write_text(TWO_H100.replace("count: 2", "count: 4"))
    for args, words in ((["--system", "HGX-H100-9"], "did you mean HGX-H100-8"),
                        (["--system", str(nodes)], "has 2 fabric domains of 2 chips: plans across domains"),
                        (["--system", str(bad)], f"{bad}:5:9: error: chips.name: unknown chip 'H100-SXM5-80G'; "
                                                 "did you mean 'H100-SXM5-80GB'?"),
                        (["--system", "HGX-H100-8", "--chips", "2xA100-SXM4-80GB"], "exactly one")):
        res = CliRunner().invoke(cli, ["plan", "decode", "tiny-llama", "--context", "64", "--registry", url, *args])
        assert res.exit_code == 1, (args, res.output)
        assert words in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_compare_accepts_system_names(url):
    args = ["plan", "compare", "tiny-llama", "--systems", "NPU-V3-BOARD4,2xA100-SXM4-80GB,NO-SUCH", "--context",
            "64", "--prompt", "8", "--registry", url, "--json"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    rows = {r["system"]: r for r in json.loads(res.stdout)["rows"]}
    assert rows["NPU-V3-BOARD4"]["ok"] and rows["NPU-V3-BOARD4"]["chips"] == 4
    assert rows["2xA100-SXM4-80GB"]["ok"]
    assert not rows["NO-SUCH"]["ok"] and "no system named 'NO-SUCH'" in rows["NO-SUCH"]["error"]
