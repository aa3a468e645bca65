"""Issue 52 case 3: what-if answers never allocate what they describe. Before: ``plan memory
tiny-llama --context 10**12`` (and explain, decode, max-batch; ``max-context --batch 10**12``)
died in ``DefaultCPUAllocator: can't allocate memory: you tried to allocate 127999999999872
bytes``; ``--context 4000000`` held 2.4 GB for 21 s before the planner's refusal, because
``planner/lm.py`` built real zero KV-cache tensors first. Now the decode step's inputs are shapes
without storage and sizes no tensor can describe are refused before anything is built."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from torchfl.planner.lm import ShapeTooLarge, decode_inputs, prefill_inputs, tiny_llama


@pytest.fixture(scope="module")
def lm():
    return tiny_llama()[0]


def _storage_less(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return t.is_meta or isinstance(t, FakeTensor)


def test_decode_and_prefill_inputs_have_no_storage(lm):
    _step, inputs = decode_inputs(lm, 1, 10 ** 12)
    assert inputs[1].shape == (1, 2, 10 ** 12 - 1, 16)
    assert all(_storage_less(x) for x in inputs)
    _step, inputs = prefill_inputs(lm, 2, 10 ** 8)
    assert all(_storage_less(x) for x in inputs) and inputs[0].shape == (2, 10 ** 8)


def test_a_prompt_whose_attention_no_tensor_can_describe_is_refused_first(lm):
    """Before: ``plan decode tiny-llama --prompt 10**12`` reached torch.export, whose fake tensors
    overflowed ("numel: integer multiplication overflow", torch's logger printing a traceback)."""
    with pytest.raises(ShapeTooLarge, match="attention scores at batch 1, prompt 1000000000000 would be"):
        prefill_inputs(lm, 1, 10 ** 12)


@pytest.mark.parametrize("batch, context, words", [
    (1, 10 ** 20, "more than any tensor can describe"),
    (10 ** 18, 100, "more than any tensor can describe"),
    (0, 100, "batch must be a positive integer"),
    (1, 1, "context must be at least 2"),
])
def test_sizes_no_tensor_can_hold_are_refused_first(lm, batch, context, words):
    with pytest.raises(ShapeTooLarge, match=words):
        decode_inputs(lm, batch, context)


SCRIPT = r"""
import json, resource, time
from torchfl.planner import whatif
from torchfl.planner.lm import tiny_llama
from torchfl.planner.target import resolve_target
m = tiny_llama()[0]
dec = whatif.Decoder(m)
chip = resolve_target("NPU-V3")
out = {"rss_before_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
for context in (4_000_000, 10 ** 12):
    t0 = time.perf_counter()
    p = whatif.plan_decode(chip, dec, 1, context, None)
    out[str(context)] = [p.ok, getattr(p.error, "field", None), time.perf_counter() - t0]
r = whatif.max_context(m, chip, batch=10 ** 12, precision=None, dec=dec)
out["max_context"] = [r.context, r.limit]
r = whatif.max_batch_at_context(m, chip, 10 ** 12, precision=None, dec=dec)
out["max_batch"] = [r.batch, r.limit]
out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def test_huge_contexts_are_refused_by_the_planner_with_little_memory():
    """4 million and 10**12 cached positions, and max-context at batch 10**12, in one fresh
    process: each a refusal naming the HCD limit, the process's peak memory that of torch and
    the model (~0.5 GB; before: 2.4 GB at 4 million, an allocator crash at 10**12)."""
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for context in ("4000000", "1000000000000"):
        ok, field, _seconds = out[context]
        assert (ok, field) == (False, "constraints.max_sequence_length")
    assert out["max_context"][0] == 0 and "batch" in out["max_context"][1]
    assert out["max_batch"][0] == 0 and "sequence" in out["max_batch"][1]
    # what the answers add to the process's peak (imports, the registry's first seeding and the
    # model come before): before the fix, 2.4 GB at 4 million positions
    assert out["rss_mb"] - out["rss_before_mb"] < 700, out


def test_cli_refuses_a_context_no_tensor_can_describe_in_one_line():
    from torchfl.cli.main import cli

    res = CliRunner().invoke(cli, ["plan", "memory", "tiny-llama", "--chip", "NPU-V3", "--context", str(10 ** 20)])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line.startswith("Error: ") and "--context" in line, line
