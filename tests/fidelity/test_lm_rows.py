"""Language-model rows of a fidelity table (prefill, decode, generate): parsed, planned with the
planner's serving prediction and scored, end to end on a small model (real capture, real plans)."""
from __future__ import annotations

import pytest

from torchfl.fidelity.run import score_tables
from torchfl.fidelity.tables import TableError, bundled_tables, load_tables, parse_table
from torchfl.hcd import load_hcd
from torchfl.resources import bundled_path

TINY = """# rows of a 4-layer LLaMA: the machinery's test, not measurements of a chip
chip,op,shapes,dtype,args,seconds,source
A100-SXM4-80GB,prefill,1x32,float16,"{""model"": ""tiny-llama""}",0.0005,t1
A100-SXM4-80GB,decode,1x48,float16,"{""model"": ""tiny-llama""}",0.0004,t2
A100-SXM4-80GB,decode,2x48,float16,"{""model"": ""tiny-llama""}",0.0004,t3
A100-SXM4-80GB,generate,1x32,float16,"{""model"": ""tiny-llama"", ""new_tokens"": 32}",0.02,t4
A100-SXM4-80GB,decode,1x48,float16,"{""model"": ""gpt-9""}",0.0004,t5
"""


@pytest.fixture(scope="module")
def a100():
    from torchfl.planner import resolve_target

    return resolve_target(load_hcd(bundled_path("hcd_registry") / "a100_sxm4_80gb.hcd"))


def _plan_time(plan) -> float:
    return sum(s.predicted_time_s for s in plan.steps if not s.static)


def test_small_table_scored_end_to_end(a100):
    from torchfl.fidelity.lm import _decoder
    from torchfl.planner.whatif import plan_decode

    table = parse_table(TINY, "tiny.csv")
    result = score_tables([table], lambda name: a100)
    pre, dec1, dec2, gen, bad = result.predictions
    assert all(p.predicted_s and p.predicted_s > 0 for p in (pre, dec1, dec2, gen)), result.predictions
    assert not any(p.fallbacks for p in (pre, dec1, dec2, gen))
    # scored as (predicted - measured) / measured, per family like the op tables
    assert dec1.error == pytest.approx((dec1.predicted_s - 0.0004) / 0.0004)
    fams = {s.family: s for s in result.scores}
    assert set(fams) == {"prefill", "decode", "generate", "all"}
    assert fams["decode"].rows == 2 and fams["all"].rows == 4 and fams["all"].unplanned == 1
    assert fams["decode"].mean_abs_error == pytest.approx((abs(dec1.error) + abs(dec2.error)) / 2)
    # a decode row is one step at its context; two sequences cost more than one
    dec = _decoder("tiny", "float16")
    assert dec1.predicted_s == pytest.approx(_plan_time(plan_decode(a100, dec, 1, 48, None).plan))
    assert dec2.predicted_s > dec1.predicted_s
    # a request: the prefill, then new_tokens - 1 steps at their mean context (32 + 32 // 2)
    step = _plan_time(plan_decode(a100, dec, 1, 48, None).plan)
    assert gen.predicted_s == pytest.approx(pre.predicted_s + 31 * step)
    assert "launch costs" in " ".join(gen.notes)
    # an unknown model is a row not planned, with the fix
    assert bad.predicted_s is None and "tiny-llama" in bad.reason and "gpt-9" in bad.reason


def test_graph_submitted_rows_pay_the_graph_launch_per_kernel(a100):
    """An engine that enqueues the whole step as one graph (gpt-fast, TensorRT-LLM) does not pay
    the eager per-kernel host launch and sync: its rows are priced with the HCD's
    execution.graph_launch_overhead_us (0.58 us) for every kernel instead (same plan otherwise)."""
    text = ("chip,op,shapes,dtype,args,seconds,source\n"
            'A100-SXM4-80GB,decode,1x48,float16,"{""model"": ""tiny-llama""}",0.0004,e\n'
            'A100-SXM4-80GB,decode,1x48,float16,"{""model"": ""tiny-llama"", ""submission"": ""eager""}",0.0004,e2\n'
            'A100-SXM4-80GB,decode,1x48,float16,"{""model"": ""tiny-llama"", ""submission"": ""graph""}",0.0004,g\n')
    eager, eager2, graph = score_tables([parse_table(text, "sub.csv")], lambda name: a100).predictions
    assert eager.predicted_s == eager2.predicted_s       # "eager" is the default
    assert graph.predicted_s < eager.predicted_s
    kernels = int(eager.notes[0].split(" kernels")[0].rsplit(" ", 1)[1])
    launch_ms = [float(n.split(", ")[2].split(" ms")[0]) for n in (eager.notes[0], graph.notes[0])]
    # each kernel that launches pays 0.58 us instead of 12 us (21 us a GEMM); metadata steps pay none
    assert 0 < launch_ms[1] <= kernels * 0.58e-3 * 1.01
    assert 12 / 0.58 * 0.99 <= launch_ms[0] / launch_ms[1] <= 21 / 0.58 * 1.01
    assert eager.predicted_s - graph.predicted_s == pytest.approx((launch_ms[0] - launch_ms[1]) * 1e-3, rel=0.02)
    assert any("graph submission: 0.58 us a kernel" in n for n in graph.notes)


def test_graph_submission_on_a_chip_without_the_field_says_so():
    from torchfl.planner import resolve_target

    mi210 = resolve_target(load_hcd(bundled_path("hcd_registry") / "mi210.hcd"))
    text = ('chip,op,shapes,dtype,args,seconds,source\n'
            'MI210,decode,1x48,float16,"{""model"": ""tiny-llama"", ""submission"": ""graph""}",0.0004,g\n'
            'MI210,decode,1x48,float16,"{""model"": ""tiny-llama""}",0.0004,e\n')
    graph, eager = score_tables([parse_table(text, "m.csv")], lambda name: mi210).predictions
    assert graph.predicted_s == eager.predicted_s
    assert any("states no execution.graph_launch_overhead_us" in n for n in graph.notes)


@pytest.mark.parametrize("shapes,args,message", [
    ("1x8", '{""model"": ""tiny-llama"", ""submission"": ""batched""}', "one of eager, graph"),
    ("1x8;1x8", '{""model"": ""tiny-llama""}', "one shape BATCHxTOKENS"),
    ("1x8", '{""model"": ""tiny-llama"", ""new_tokens"": 3}', "remove new_tokens"),
    ("1x1", '{""model"": ""tiny-llama""}', "at least 2"),
])
def test_bad_language_model_rows_name_the_fix(a100, shapes, args, message):
    text = f'chip,op,shapes,dtype,args,seconds,source\nA100-SXM4-80GB,decode,{shapes},float16,"{args}",0.01,x\n'
    [p] = score_tables([parse_table(text, "bad.csv")], lambda name: a100).predictions
    assert p.predicted_s is None and message in p.reason and "bad.csv:2" in p.reason


def test_generate_needs_new_tokens(a100):
    text = 'chip,op,shapes,dtype,args,seconds,source\nA100-SXM4-80GB,generate,1x8,float16,"{""model"": ""tiny-llama""}",1,x\n'
    [p] = score_tables([parse_table(text, "g.csv")], lambda name: a100).predictions
    assert p.predicted_s is None and "new_tokens" in p.reason


def test_unknown_op_is_still_refused_at_load():
    with pytest.raises(TableError, match="neither an ATen overload"):
        parse_table("chip,op,shapes,dtype,args,seconds,source\nA,decoder,1x8,float16,,1,x\n")


def test_bundled_language_model_tables_cite_their_source():
    """Each published LLaMA-2 7B table names where its numbers come from, its terms and the
    engine's per-token overhead; the A100 and H100 both have rows."""
    lm = [t for t in load_tables(bundled_tables()) if {r.family for r in t.rows} <= {"prefill", "decode", "generate"}
          and "_tp" not in str(t.path).rsplit("/", 1)[-1]]    # tensor-parallel tables: tests/parallel/test_tp_fidelity.py
    assert len(lm) == 4
    chips = set()
    for t in lm:
        text = "\n".join(t.comments)
        assert "https://" in text and ("Licence" in text or "licence" in text), t.path
        assert "overhead" in text, t.path
        assert all(r.args["model"] == "llama-2-7b" for r in t.rows)
        # how the engine submits its kernels, stated per row and read from the source's own text
        assert all(r.args.get("submission") in ("eager", "graph") for r in t.rows), t.path
        assert "Submission:" in text, t.path
        chips |= {r.chip for r in t.rows}
    assert chips == {"A100-SXM4-80GB", "H100-SXM5-80GB"}
    assert {r.family for t in lm for r in t.rows} == {"prefill", "decode", "generate"}


def test_paged_cache_rows_leave_out_the_cache_copies_as_plan_decode_does(a100):
    """A row stating ``"kv_cache": "paged"`` (an engine writing the new token's keys and values in
    place: vLLM, TensorRT-LLM, LMDeploy, gpt-fast's static cache) is priced as ``plan decode
    --kv-cache paged`` prices it: the captured step without its whole-cache copies (``paged_saving``,
    the same Engine); "copied" is the default; any other value is refused with the choices."""
    from torchfl.fidelity.lm import _decoder
    from torchfl.planner.whatif import plan_decode
    from torchfl.planner.whatif.serving import Engine, paged_saving

    head = "chip,op,shapes,dtype,args,seconds,source\n"
    text = (head + 'A100-SXM4-80GB,decode,2x300,float16,"{""model"": ""tiny-llama""}",0.0004,c\n'
            'A100-SXM4-80GB,decode,2x300,float16,"{""model"": ""tiny-llama"", ""kv_cache"": ""copied""}",0.0004,c2\n'
            'A100-SXM4-80GB,decode,2x300,float16,"{""model"": ""tiny-llama"", ""kv_cache"": ""paged""}",0.0004,p\n'
            'A100-SXM4-80GB,generate,2x300,float16,"{""model"": ""tiny-llama"", ""kv_cache"": ""paged"", '
            '""new_tokens"": 4}",0.01,gp\n'
            'A100-SXM4-80GB,generate,2x300,float16,"{""model"": ""tiny-llama"", ""new_tokens"": 4}",0.01,gc\n')
    copied, copied2, paged, gen_paged, gen_copied = score_tables([parse_table(text, "kv.csv")],
                                                                 lambda name: a100).predictions
    assert copied.predicted_s == copied2.predicted_s
    step = plan_decode(a100, _decoder("tiny", "float16"), 2, 300, None).plan
    saved = paged_saving(step, a100.model)
    assert saved > 0 and paged.predicted_s == pytest.approx(copied.predicted_s - saved)
    assert "KV cache paged" in paged.notes[0] and "KV cache paged" not in copied.notes[0]
    # a request saves it on each of its new_tokens - 1 steps (at the mean context 302), not on the prefill
    mean_step = plan_decode(a100, _decoder("tiny", "float16"), 2, 302, None).plan
    assert gen_copied.predicted_s - gen_paged.predicted_s == pytest.approx(3 * paged_saving(mean_step, a100.model))
    assert Engine("eager", "paged").cache == "paged"
    bad = parse_table(head + 'A100-SXM4-80GB,decode,2x300,float16,"{""model"": ""tiny-llama"", '
                             '""kv_cache"": ""ring""}",0.0004,r\n', "bad.csv")
    (refused,) = score_tables([bad], lambda name: a100).predictions
    assert refused.predicted_s is None
    assert "kv_cache" in refused.reason and "copied, paged" in refused.reason and "'ring'" in refused.reason
