"""Confidence and engine behaviour in the what-if answers (issue 47 items 5 and 6): ``plan decode``
states the engine it assumes and takes ``--engine`` / ``--kv-cache``; its time is per call; a
step with CPU fallbacks gets no tokens/s; the bound named is the dominant term; every answer
carries its confidence (JSON) and prints it within 100 columns. Real registry, real plans."""
import json

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli


def plan(*args):
    return CliRunner().invoke(cli, ["plan", *args])


@pytest.fixture(scope="module")
def tiny():
    from torchfl.planner import whatif
    from torchfl.planner.zoo import load_model

    module, _inputs = load_model("tiny-llama")
    return whatif.Decoder(module)


def _row(tiny, chip, **kw):
    from torchfl.planner import whatif

    keep = {}
    r = whatif.decode_row(whatif.chip_of(chip), tiny, 1, 8, kw.pop("context", 64), kw.pop("precision", None),
                          keep=keep, **kw)
    assert r["ok"], r
    return r, keep


def test_decode_time_is_per_call_not_run_once(tiny):
    """A precision policy casts the weights once at load; a token does not pay it again."""
    r, keep = _row(tiny, "A100-SXM4-80GB", precision="float16")
    s = keep["decode"].summary
    assert s.run_once_time_s > 0 and r["decode_s"] == pytest.approx(s.per_call_time_s, rel=1e-12)
    assert r["prefill_s"] == pytest.approx(keep["prefill"].summary.per_call_time_s, rel=1e-12)
    assert r["tokens_per_s"] == pytest.approx(1 / s.per_call_time_s)


def test_engine_graph_prices_launches_at_the_graph_cost(tiny):
    from torchfl.planner.whatif import Engine

    eager, keep = _row(tiny, "A100-SXM4-80GB")
    graph, gkeep = _row(tiny, "A100-SXM4-80GB", engine=Engine("graph"))
    assert eager["engine"]["submission"] == "eager" and "eager launches" in eager["assumes"]
    assert graph["engine"]["submission"] == "graph" and "graph submission" in graph["assumes"]
    kernels = [s for s in keep["decode"].steps if not s.static and s.predicted_time_s > 0
               and s.kind not in ("fallback", "fold")]
    # same plan shape, each kernel's launch 12-21 us eager vs 0.58 us as a graph node
    assert eager["decode_s"] - graph["decode_s"] > len(kernels) * (12 - 0.58) * 1e-6
    assert eager["bound"] == "launch" and eager["bound_share"] > 0.9     # not "memory, 100%"
    # a chip that states no graph launch cost keeps its eager costs, and says so
    mi, _ = _row(tiny, "MI210", engine=Engine("graph"))
    assert "states no execution.graph_launch_overhead_us" in mi["assumes"]
    with pytest.raises(ValueError, match="use one of eager, graph"):
        Engine("cuda-graphs")


def test_paged_cache_writes_only_the_new_token(tiny):
    from torchfl.planner.whatif import Engine
    from torchfl.planner.whatif.serving import _cache_appends, paged_saving

    copied, keep = _row(tiny, "NPU-V3", context=1024, precision="float16")
    paged, _ = _row(tiny, "NPU-V3", context=1024, precision="float16", engine=Engine("eager", "paged"))
    appends = _cache_appends(keep["decode"])
    assert len(appends) == 2 * 2                        # keys and values of tiny-llama's 2 layers
    saved = paged_saving(keep["decode"], __import__("torchfl.planner.whatif", fromlist=["x"]).chip_of("NPU-V3").model)
    assert 0 < saved < sum(s.predicted_time_s for s in appends)
    assert copied["decode_s"] - paged["decode_s"] == pytest.approx(saved, rel=1e-9)
    assert "paged in place" in paged["assumes"]


def test_decode_cli_states_engine_bound_and_confidence():
    out = plan("decode", "tiny-llama", "--chip", "A100-SXM4-80GB", "--context", "64", "--prompt", "8",
               "--engine", "graph")
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert "engine: graph submission" in " ".join(lines[:3])
    assert "-bound" in out.stdout and "confidence:" in out.stdout
    assert "100% of this time priced from assumed or unstated numbers" in out.stdout   # a 1.1 file: unstated
    assert max(map(len, lines)) <= 100
    out = plan("decode", "tiny-llama", "--chip", "A100-SXM4-80GB", "--context", "64", "--prompt", "8", "--json")
    data = json.loads(out.stdout)
    assert data["engine"] == {"submission": "eager", "cache": "copied", "host_work_between_steps_s": 0.0}
    assert data["confidence"]["assumption_share"] == 1.0 and data["bound"] == "launch"
    out = plan("compare", "tiny-llama", "--chips", "A100-SXM4-80GB,NPU-V3", "--context", "64", "--prompt", "8")
    assert out.exit_code == 0, out.output
    assert "assumed" in out.stdout and "engine: eager launches" in out.stdout
    assert max(map(len, out.stdout.splitlines())) <= 100


def test_compare_json_carries_confidence_and_rank_rule():
    out = plan("compare", "mlp", "--chips", "A100-SXM4-80GB,NPU-V3", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert "least costly value" in data["rank_rule"]
    for r in data["rows"]:
        c = r["confidence"]
        assert c["assumption_share"] == 1.0 and c["state"] in ("unchecked", "checked", "stale")
    npu = next(r for r in data["rows"] if r["chip"] == "NPU-V3")
    assert "execution.launch_overhead_us" in npu["confidence"]["missing"]
    assert npu["rank_time_s"] > npu["per_call_time_s"]           # priced at the A100's launch costs to rank
    text = plan("compare", "mlp", "--chips", "A100-SXM4-80GB,NPU-V3").stdout
    assert "ranked as if" in text and max(map(len, text.splitlines())) <= 100
