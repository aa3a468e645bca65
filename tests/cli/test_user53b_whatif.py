"""Issue 53 point 12 leftovers: `plan max-context resnet50` complained about a --context the
user never gave; `plan max-context --json` labelled its probes `batch`; "precision as captured"
did not say which dtype that is."""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from torchfl.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]


def _reg(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'lm.sqlite3'}"
    r = CliRunner()
    assert r.invoke(cli, ["registry", "init", "--registry", url]).exit_code == 0
    res = r.invoke(cli, ["registry", "import", "--registry", url, str(ROOT / "examples" / "tiny_kv.hcd")])
    assert res.exit_code == 0, res.output
    return url


def test_max_context_of_a_model_that_is_no_lm_names_the_command(tmp_path):
    res = CliRunner().invoke(cli, ["plan", "max-context", "resnet50", "--chip", "TINY-KV", "--registry", _reg(tmp_path)])
    assert res.exit_code == 1
    text = " ".join(res.output.split())
    assert "plan max-context needs a causal language model" in text and "--context" not in text, text


def test_max_context_names_its_probes_context_and_the_weights_dtype(tmp_path):
    url = _reg(tmp_path)
    args = ["plan", "max-context", "tiny-llama", "--chip", "TINY-KV", "--batch", "8", "--precision", "none",
            "--registry", url]
    res = CliRunner().invoke(cli, args + ["--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["probes"] and all("context" in p and "batch" not in p for p in data["probes"]), data["probes"]
    text = CliRunner().invoke(cli, args).stdout
    assert "max context of tiny-llama (batch 8, precision float32 weights) on TINY-KV" in text, text
