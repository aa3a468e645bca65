"""The decoder faces of the CLI: ``plan max-context``, ``max-batch --context``, ``memory --context``,
``decode``, ``compare --context`` and ``explain --context``, on a real SQLite registry."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli

TINY = Path(__file__).parents[2] / "examples" / "tiny_kv.hcd"     # TFL-X1 with 2 MB of off-chip memory


@pytest.fixture(scope="module", autouse=True)
def tiny_chip(registry_url):
    from torchfl.registry import Registry

    reg = Registry(registry_url)
    reg.import_files([TINY])
    reg.close()


def plan(*args):
    return CliRunner().invoke(cli, ["plan", *args])


def test_max_context_names_the_memory_and_the_cache():
    out = plan("max-context", "tiny-llama", "--chip", "TINY-KV", "--batch", "8", "--precision", "none", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["limit"] == "memory" and 64 < data["context"] < 2048
    assert data["kv_cache_bytes"] == 2 * 2 * 8 * 2 * data["context"] * 16 * 4    # layers, k/v, batch, heads, dim
    assert "KV cache" in data["reason"] and "memory.off_chip_memory.size_gb" in data["reason"]
    refused = [p for p in data["probes"] if not p["ok"]]
    assert min(p["context"] for p in refused) == data["context"] + 1     # probes are labelled context


def test_max_batch_and_memory_at_a_context():
    out = plan("max-batch", "tiny-llama", "--chip", "TINY-KV", "--context", "100", "--precision", "none")
    assert out.exit_code == 0, out.output
    assert "decode step at context 100" in out.output and "limited by: memory" in out.output
    out = plan("memory", "tiny-llama", "--chip", "TFL-X1", "--context", "100", "--batch", "2")
    assert out.exit_code == 0, out.output
    assert "KV cache: 100.00 KiB in 2 layers" in out.output
    assert "2x2x100x16" in out.output and "kv_cache" in out.output


def test_decode_speed_predicted_and_chips_ranked_by_tokens_per_second():
    out = plan("decode", "tiny-llama", "--chip", "TFL-X1", "--context", "256", "--prompt", "16")
    assert out.exit_code == 0, out.output
    assert "prefill of 16 tokens (time to first token):" in out.output and "tokens/s" in out.output
    out = plan("compare", "tiny-llama", "--chips", "TFL-X1,NPU-V3", "--context", "256", "--prompt", "16", "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["rows"]
    assert [r["ok"] for r in rows] == [True, True]
    assert rows[0]["tokens_per_s"] >= rows[1]["tokens_per_s"] > 0
    for r in rows:
        assert r["tokens_per_s"] == pytest.approx(1 / r["decode_s"]) and r["prefill_s"] > 0
    out = plan("explain", "tiny-llama", "--chip", "TFL-X1", "--context", "64", "--prompt", "8")
    assert out.exit_code == 0, out.output
    assert out.output.startswith("Decoder tiny-llama, batch 1 (predicted; engine: eager launches")
    first = " ".join(out.output.split("The decode step's plan:")[0].split())   # wrapped to 100 columns
    assert "prefill of 8 tokens" in first and "tokens/s" in first


def test_context_needs_a_causal_lm():
    out = plan("max-context", "mlp", "--chip", "TFL-X1")
    assert out.exit_code == 1
    assert "needs a causal language model" in out.output and "Traceback" not in out.output
