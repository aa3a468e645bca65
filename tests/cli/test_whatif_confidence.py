"""Confidence and engine behaviour in the what-if answers (issue 47 items 5 and 6): ``plan decode``
states the engine it assumes and takes ``--engine`` / ``--kv-cache``; its time is per call; a
step with CPU fallbacks gets no tokens/s; the bound named is the dominant term; every answer
carries its confidence (JSON) and prints it within 100 columns. Real registry, real plans."""
import json
import re
from pathlib import Path

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
    from torchfl.planner import whatif

    bare = next(n for n in ("NPU-V3", "TFL-X1", "MI210") if whatif.chip_of(n).model.graph_launch_s is None)
    r, _ = _row(tiny, bare, engine=Engine("graph"), precision="auto")
    e, _ = _row(tiny, bare, precision="auto")
    assert "states no execution.graph_launch_overhead_us" in r["assumes"] and r["decode_s"] == e["decode_s"]
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
    assert re.search(r"\d+% of this time priced from assumed or unstated numbers", " ".join(out.stdout.split()))
    assert max(map(len, lines)) <= 100
    out = plan("decode", "tiny-llama", "--chip", "A100-SXM4-80GB", "--context", "64", "--prompt", "8", "--json")
    data = json.loads(out.stdout)
    assert data["engine"] == {"submission": "eager", "cache": "copied", "host_work_between_steps_s": 0.0}
    assert 0 <= data["confidence"]["assumption_share"] <= 1 and data["bound"] == "launch"
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
        assert 0 <= c["assumption_share"] <= 1 and c["state"] in ("unchecked", "checked", "stale")
    npu = next(r for r in data["rows"] if r["chip"] == "NPU-V3")
    if "execution.launch_overhead_us" in npu["confidence"]["missing"]:    # the reference NPU states no launch
        assert npu["rank_time_s"] > npu["per_call_time_s"]       # priced at the A100's launch costs to rank
    else:
        assert "rank_time_s" not in npu
    text = plan("compare", "mlp", "--chips", "A100-SXM4-80GB,NPU-V3").stdout
    assert "ranked as if" in text and max(map(len, text.splitlines())) <= 100


def test_report_and_impact_show_confidence(tmp_path):
    pytest.importorskip("matplotlib")
    page = tmp_path / "r.html"
    out = plan("report", "mlp", "--chips", "A100-SXM4-80GB,NPU-V3", "--chip", "NPU-V3", "-o", str(page))
    assert out.exit_code == 0, out.output
    text = page.read_text()
    assert 'id="confidence"' in text and re.search(r"Confidence: \d+% of the per-call time priced", text)
    assert "<th>confidence</th>" in text and re.search(r"\d+% assumed;", text)
    # impact: each model's line says how much of its time assumed numbers priced, on both versions
    out = plan("impact", "--chip", "NPU-V3", "--from", "1.0.0", "--to", "1.0.0", "--models", "mlp")
    assert out.exit_code == 0, out.output
    assert re.search(r"\d+%!? -> \d+%!? of the time priced from assumed or unstated numbers", " ".join(out.stdout.split()))
    assert max(map(len, out.stdout.splitlines())) <= 100
    out = plan("impact", "--chip", "NPU-V3", "--from", "1.0.0", "--to", "1.0.0", "--models", "mlp", "--json")
    (m,) = json.loads(out.stdout)["models"]
    assert m["after"]["confidence"] == m["before"]["confidence"]           # the same version twice


def test_out_of_sample_check_comes_from_the_registry(tmp_path):
    """A recorded fidelity run is the chip's out-of-sample check in compare's rows and text."""
    from torchfl.registry import Registry
    from torchfl.registry.fidelity import fidelity_summary

    url = f"sqlite:///{tmp_path / 'reg.sqlite3'}"
    Registry(url).init(seed=True)
    table = Path(__file__).resolve().parents[2] / "measurements" / "llmcompass_softmax_a100.csv"
    out = CliRunner().invoke(cli, ["fidelity", "--table", str(table), "--chip",
                                   "A100-SXM4-80GB", "--record", "--registry", url])
    assert out.exit_code == 0, out.output
    with Registry(url) as reg:
        s = fidelity_summary(reg, "A100-SXM4-80GB")
    assert s["state"] == "checked" and s["out_of_sample"] > 0
    out = plan("compare", "mlp", "--chips", "A100-SXM4-80GB,NPU-V3", "--registry", url, "--json")
    rows = {r["chip"]: r["confidence"] for r in json.loads(out.stdout)["rows"]}
    assert rows["A100-SXM4-80GB"]["state"] == "checked"
    assert rows["A100-SXM4-80GB"]["checked_rows"] == s["out_of_sample"]
    assert rows["A100-SXM4-80GB"]["out_of_sample_mae"] == pytest.approx(s["out_of_sample_mean_abs_error"])
    assert rows["NPU-V3"]["state"] == "unchecked" and rows["NPU-V3"]["checked_rows"] == 0
    text = plan("compare", "mlp", "--chips", "A100-SXM4-80GB,NPU-V3", "--registry", url).stdout
    assert f"{100 * s['out_of_sample_mean_abs_error']:.0f}% on {s['out_of_sample']}" in text


def test_decode_with_cpu_fallbacks_has_no_tokens_per_second():
    """float16 weights on a chip that stores only bfloat16 (GAUDI2; LLaMA-2 7B's 2,250 fallbacks a
    token in the issue): the step's host work is not priced, so no tokens/s, a lower bound, and
    the host link named as what bounds it."""
    from torchfl.planner import whatif
    from torchfl.planner.zoo import load_model

    module, _inputs = load_model("tiny-llama")
    keep = {}
    r = whatif.decode_row(whatif.chip_of("GAUDI2"), whatif.Decoder(module.half()), 1, 8, 64, "bfloat16", keep=keep)
    assert r["ok"] and r["decode_fallbacks"] == keep["decode"].summary.fallbacks > 0
    assert r["tokens_per_s"] is None and r["decode_is_lower_bound"] and r["decode_s"] > 0
    # the dominant term: the host link where the chip states no launch cost; GAUDI2 1.1.0 states
    # the class default (22 / 34 us), which a tiny model's ~100 kernels a step outweigh
    assert r["bound"] in ("host", "launch") and 0 < r["bound_share"] <= 1
    from torchfl.cli.whatif_cmd.serving import decode_speed

    assert "no tokens/s" in decode_speed(r) and decode_speed(r).startswith("at least ")


def test_compare_decode_names_chips_without_a_graph_cost():
    from torchfl.cli.whatif_cmd.serving import decode_text
    from torchfl.planner import whatif
    from torchfl.planner.zoo import load_model

    module, _inputs = load_model("tiny-llama")
    chips = [whatif.chip_of(n) for n in ("A100-SXM4-80GB", "NPU-V3")]
    res = whatif.compare_decode(module, chips, 1, 8, 64, "auto", whatif.Engine("graph"))
    assert res["engine"]["submission"] == "graph"
    text = " ".join(decode_text("tiny-llama", res).split())
    bare = [c.name for c in chips if c.model.graph_launch_s is None]
    assert ("graph submission asked, but " + ", ".join(bare)) in text if bare else "asked, but" not in text
