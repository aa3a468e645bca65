"""generate() on the chip in both modes (torch.compile(backend="torchfl") and the eager npu
device), the zoo's 8 decoder families from tiny configs: greedy tokens equal eager torch's in
the same dtype (float32, on TFL-X1: its float32 unit computes what the CPU does, to rounding).
Sampling with a seed and beam search through the compiled forward; Hugging Face's static cache."""
import pytest
import torch

from tests.lm.families import FAMILIES, model

X1 = {"chip": "TFL-X1"}
NEW = 6


def _ids(seed=1):
    return torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(seed))


def _generate(m, ids, **kw):
    kw.setdefault("do_sample", False)
    with torch.no_grad():
        return m.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, **kw)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_compiled(family):
    m, _cfg = model(family)
    ids = _ids()
    ref = _generate(m, ids)
    m.forward = torch.compile(m.forward, backend="torchfl", options=X1)
    assert torch.equal(_generate(m, ids), ref)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_on_the_npu_device(family):
    """model.to("npu:0") (TFL-X1 in the test session): every op planned and run on the chip or
    a logged host fallback; the tokens come back to the CPU equal."""
    m, _cfg = model(family)
    ids = _ids()
    ref = _generate(m, ids)
    m = m.to("npu:0")
    out = _generate(m, ids.to("npu:0"))
    assert out.device.type == "npu"
    assert torch.equal(out.cpu(), ref)


def test_sampling_with_a_seed_and_beam_search_compiled():
    m, _cfg = model("llama")
    ids = _ids(2)
    torch.manual_seed(7)
    sampled = _generate(m, ids, do_sample=True, top_k=20)
    beams = _generate(m, ids, num_beams=3)
    m.forward = torch.compile(m.forward, backend="torchfl", options=X1)
    torch.manual_seed(7)
    assert torch.equal(_generate(m, ids, do_sample=True, top_k=20), sampled)
    assert torch.equal(_generate(m, ids, num_beams=3), beams)


def test_static_cache_compiled_makes_one_decode_plan():
    """Hugging Face's static cache: the cache has its maximum length from the start, so every
    decode step has the same shapes: one plan for all of them (and one for the prefill)."""
    from torchfl.runtime import backend

    m, _cfg = model("llama")
    ids = _ids(3)
    ref = _generate(m, ids, cache_implementation="static")
    made = []
    init = backend.CompiledGraph.__init__

    def spy(self, *a, **k):
        init(self, *a, **k)
        made.append(self)
    backend.CompiledGraph.__init__ = spy
    try:
        m.forward = torch.compile(m.forward, backend="torchfl", options=X1)
        assert torch.equal(_generate(m, ids, cache_implementation="static"), ref)
    finally:
        backend.CompiledGraph.__init__ = init
    assert sum(g.decisions for g in made) <= 3, [(g.decisions, g.lengths) for g in made]
