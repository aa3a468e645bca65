"""``plan decode|memory --chips NxCHIP`` on a tiny model: the split, memory per chip, collectives."""

from __future__ import annotations

import json

from click.testing import CliRunner

from torchfl.cli.main import cli


def _reg(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'r.sqlite3'}"
    assert CliRunner().invoke(cli, ["registry", "init", "--registry", url]).exit_code == 0
    return url


def test_decode_over_two_chips(tmp_path):
    url = _reg(tmp_path)
    args = ["plan", "decode", "tiny-llama", "--chips", "2xA100-SXM4-80GB", "--context", "64", "--prompt", "8",
            "--registry", url]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "tiny-llama on 2x A100-SXM4-80GB" in text and "split: tensor parallel" in text
    assert "memory per chip: peak" in text and "per token" in text and "collectives" in text
    assert "all-reduce (tp): 5 a step" in text and "over the links per token" in text
    data = json.loads(CliRunner().invoke(cli, args + ["--json", "--tp", "2"]).stdout)
    assert data["split"] == {"tp": 2, "pp": 1, "ep": 1} and data["rows"][0]["all_reduces"] == 5
    kinds = data["rows"][0]["collectives"]
    assert set(kinds) == {"all_reduce", "all_gather"} and kinds["all_reduce"]["calls"] == 5
    assert kinds["all_reduce"]["seconds"] == data["rows"][0]["all_reduce_s"] and data["rows"][0]["bound"]
    assert data["rows"][0]["fallbacks"] == 0


def test_memory_over_chips_gives_the_memory_per_chip(tmp_path):
    res = CliRunner().invoke(cli, ["plan", "memory", "tiny-llama", "--chips", "2xH100-SXM5-80GB", "--context", "64",
                                   "--registry", _reg(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["ok"] and data["rows"][0]["peak_bytes"] > 0 and data["capacity_bytes"] == 80 << 30


def test_one_line_refusals(tmp_path):
    url = _reg(tmp_path)
    for args, words in ((["--chip", "A100-SXM4-80GB", "--chips", "2xA100-SXM4-80GB"], "not both"),
                        (["--chip", "A100-SXM4-80GB", "--tp", "2"], "add --chips"),
                        (["--chips", "2xNPU-V3"], "states no interconnect"),
                        (["--chips", "2xA100-SXM4-80GB", "--tp", "3"], "--tp 3 x --pp 1 = 3 chips"),
                        (["--chips", "A100"], "COUNTxCHIP")):
        res = CliRunner().invoke(cli, ["plan", "decode", "tiny-llama", "--context", "64", "--registry", url, *args])
        assert res.exit_code == 1, (args, res.output)
        assert words in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_compare_systems_ranks_by_tokens_per_second(tmp_path):
    args = ["plan", "compare", "tiny-llama", "--systems", "2xA100-SXM4-80GB,2xNPU-V3", "--context", "64",
            "--prompt", "8", "--registry", _reg(tmp_path)]
    res = CliRunner().invoke(cli, args + ["--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [r["system"] for r in rows] == ["2xA100-SXM4-80GB", "2xNPU-V3"]
    assert rows[0]["ok"] and rows[0]["tokens_per_s_per_chip"] == rows[0]["tokens_per_s"] / 2
    assert not rows[1]["ok"] and "states no interconnect" in rows[1]["error"]
    text = " ".join(CliRunner().invoke(cli, args).output.split())
    assert "Not plannable (1):" in text and "2xA100-SXM4-80GB 2x1" in text
    bad = CliRunner().invoke(cli, args[:5] + ["--registry", args[-1]])
    assert bad.exit_code == 1 and "give --context" in bad.output
