"""The KV cache in the memory plan, and the serving questions (longest context, largest batch at
a context) answered by planning and checked by running the answer on a small chip."""
from pathlib import Path

import pytest
import torch

from tests.lm.families import model
from torchfl.hcd import load_hcd
from torchfl.planner import resolve_target, whatif
from torchfl.planner.memory import MemoryLimitError, kv_cache_table

TINY = Path(__file__).parents[2] / "examples" / "tiny_kv.hcd"     # TFL-X1 with 2 MB of off-chip memory


@pytest.fixture(scope="module")
def llama():
    m, _cfg = model("llama")
    return m, whatif.Decoder(m)


def test_decode_step_counts_the_cache_per_layer_with_its_dtype(llama):
    m, dec = llama
    p = whatif.plan_decode(resolve_target("TFL-X1"), dec, 3, 40, None)
    assert p.ok, p.error
    table = kv_cache_table(p.plan)
    assert [(c["layer"], c["kind"]) for c in table] == [(0, "key"), (0, "value"), (1, "key"), (1, "value")]
    for c in table:     # the grown cache: 40 positions, the model's own dtype and heads
        assert c["shape"] == [3, 2, 40, 16] and c["dtype"] == "float32" and c["bytes"] == 3 * 2 * 40 * 16 * 4
    assert sum(c["bytes"] for c in table) == dec.cache_bytes(3, 40)
    kinds = {b.kind for b in p.plan.memory.buffers}
    assert "kv_cache" in kinds
    # in float16 (precision policy) the cache is stored in float16
    p16 = whatif.plan_decode(resolve_target("NPU-V3"), dec, 3, 40, "float16")
    assert {c["dtype"] for c in kv_cache_table(p16.plan)} == {"float16"}


def _run_step(m, dec, plan, batch, context):
    """Execute the decode step's plan on its chip with real inputs; its logits and eager's."""
    from torchfl.planner.lm import decode_inputs
    from torchfl.runtime.executor import Executor

    torch.manual_seed(3)
    step, inputs = decode_inputs(m, batch, context, dec.spec)
    inputs = (torch.randint(0, 128, inputs[0].shape),) + tuple(torch.randn(x.shape) for x in inputs[1:])
    with torch.no_grad():
        ref = step(*inputs)
    out = Executor(plan).run(inputs)
    return out, ref


def test_max_context_runs_and_one_token_more_is_refused(llama):
    """On a 2 MB chip: the answer's plan runs (the allocator's peak within the capacity), and the
    context one token longer is refused by the planner before anything runs, naming the KV cache
    and the HCD field."""
    from torchfl.runtime.device import max_memory_allocated, reset_peak_memory_stats

    m, dec = llama
    chip = resolve_target(load_hcd(TINY))
    res = whatif.max_context(m, chip, batch=8, precision=None, dec=dec)
    assert res.limit == "memory" and 64 < res.context < 512, res
    assert res.peak_bytes <= res.capacity_bytes
    over = whatif.plan_decode(chip, dec, 8, res.context + 1, None)
    assert isinstance(over.error, MemoryLimitError)
    assert "KV cache" in str(over.error) and "memory.off_chip_memory.size_gb" in str(over.error)
    fits = whatif.plan_decode(chip, dec, 8, res.context, None)
    reset_peak_memory_stats(chip)
    out, ref = _run_step(m, dec, fits.plan, 8, res.context)
    assert max_memory_allocated(chip) <= res.capacity_bytes
    torch.testing.assert_close(out[0], ref[0], rtol=1e-4, atol=1e-4)      # logits
    torch.testing.assert_close(out[1], ref[1])                              # the grown cache, exact


def test_max_batch_at_a_context(llama):
    m, dec = llama
    chip = resolve_target(load_hcd(TINY))
    res = whatif.max_batch_at_context(m, chip, 100, None, dec=dec)
    assert res.limit == "memory" and res.batch >= 2
    assert whatif.plan_decode(chip, dec, res.batch, 100, None).ok
    refused = whatif.plan_decode(chip, dec, res.batch + 1, 100, None)
    assert isinstance(refused.error, MemoryLimitError) and "KV cache" in str(refused.error)


def test_grouped_query_attention_reads_the_cache_in_place(llama):
    """LLaMA repeats each key/value head for its group (`x[:, :, None, :, :].expand(...)`: a full
    slice between the unsqueeze and the expand); folded into the attention's GQA, the decode
    step reads the cache itself and no repeated copy (2x the cache) is planned."""
    from torchfl.planner.memory import kv_cache_values

    _m, dec = llama
    p = whatif.plan_decode(resolve_target("TFL-X1"), dec, 8, 100, None)
    cache = kv_cache_values(p.plan)
    def source(value):      # through the whole-tensor slice transformers takes of the cache
        step = p.plan.step_of(value)
        return step.inputs[0] if step is not None and step.kernel == "slice" else value
    attention = [s for s in p.plan.steps if s.kernel == "attention"]
    assert len(attention) == 2
    assert all(source(s.inputs[1]) in cache and source(s.inputs[2]) in cache for s in attention)
    repeated = [s for s in p.plan.steps if s.kernel in ("expand", "copy") and s.inputs and
                source(s.inputs[0]) in cache]
    assert not repeated, repeated
