"""The plan's memory plan is the executor's contract: the allocator's live bytes after every
step and its peak equal the predicted ones on real models and kernels, and max-batch's
answer runs at that batch while one more is refused before anything runs."""

import json
import warnings

import pytest
import torch

warnings.filterwarnings("ignore")


def _after_step(mp, i):
    """Bytes the plan says stay allocated after step ``i``'s frees."""
    return sum(b.nbytes for b in mp.buffers if b.alloc <= i and (b.free is None or b.free > i))


def _measured(plan, inputs, chip=None):
    from torchfl.runtime.executor import Executor, Record

    ex = Executor(plan, chip, log=False)
    mem = ex.memory
    base = mem.memory_allocated()
    live = []
    rec = Record(on_step=lambda done, total, step: live.append(mem.memory_allocated() - base))
    ex.run(tuple(inputs), rec)
    return ex, rec, live


@pytest.mark.parametrize("name,chip,options,precision", [
    ("mlp", "NPU-V3", dict(batch=3, width=48, depth=2), "float16"),
    ("resnet18", "NPU-V3", dict(batch=1, image=32), "float16"),
    ("gpt2", "TFL-X1", dict(batch=2, seq_len=8, layers=1, hidden=48, num_heads=12), None),
])
def test_allocator_follows_the_memory_plan_step_by_step(name, chip, options, precision):
    from torchfl.planner import plan_module
    from torchfl.planner.zoo import load_model

    module, inputs = load_model(name, **options)
    plan = plan_module(module, inputs, chip=chip, precision=precision)
    mp = plan.memory
    ex, rec, live = _measured(plan, inputs)
    assert rec.peak_bytes == mp.peak_bytes > 0
    assert live == [_after_step(mp, i) for i in range(len(plan.steps))]
    assert len(mp.live_bytes) == len(plan.steps) and max(mp.live_bytes + (mp.upload_bytes,)) == mp.peak_bytes
    # every buffer is a whole number of alignment granules
    assert all(b.nbytes % mp.alignment == 0 and b.nbytes > 0 for b in mp.buffers)
    # a normal call keeps exactly the resident buffers between calls
    base = ex.memory.memory_allocated()
    ex.run(tuple(inputs))
    assert ex.memory.memory_allocated() - base == mp.resident_bytes
    ex.release()
    # explain analyze shows both peaks, equal
    from torchfl.runtime.analyze import analyze

    an = analyze(plan, inputs)
    assert an.peak_bytes == an.predicted_peak_bytes == mp.peak_bytes
    text = " ".join(an.render().split())
    assert f"peak device memory measured {mp.peak_bytes:,} B / predicted {mp.peak_bytes:,} B (equal)" in text
    assert "Device memory: peak" in " ".join(plan.explain("text").split())
    # the memory plan survives JSON
    from torchfl.planner.plan import Plan

    again = Plan.from_json(plan.to_json())
    assert again.memory == mp and json.loads(plan.to_json())["memory"]["peak_bytes"] == mp.peak_bytes


def _small_chip(size_gb):
    """NPU-V3 with ``size_gb`` of off-chip memory, under another name."""
    from torchfl.hcd import load_hcd, load_hcd_text
    from torchfl.resources import bundled_hcds

    npu_v3 = next(h for h in map(load_hcd, bundled_hcds()) if h.chip.name == "NPU-V3")
    data = json.loads(npu_v3.canonical_json())
    data["memory"]["off_chip_memory"]["size_gb"] = size_gb
    data["chip"]["name"] = "NPU-V3-SMALL"
    return load_hcd_text(json.dumps(data), "npu_v3_small.hcd")


def test_max_batch_runs_at_its_answer_and_one_more_is_refused_before_running():
    """On a chip with 0.9 MiB of device memory: the batch max-batch finds executes (the
    allocator's peak is the plan's, within the capacity); one more is refused by the
    planner with the numbers, before any kernel runs."""
    from torchfl.planner import plan_module
    from torchfl.planner.memory import MemoryLimitError
    from torchfl.planner.target import Target
    from torchfl.planner.whatif import batched, max_batch
    from torchfl.planner.zoo import load_model

    hcd = _small_chip(0.9 / 1024)
    module, inputs = load_model("mlp", batch=1, width=256, depth=2)
    res = max_batch(module, inputs, Target.of(hcd), precision="float16")
    assert res.limit == "memory" and 1 < res.batch < hcd.constraints.max_batch_size, res.to_dict()
    cap = int(hcd.memory.off_chip_memory.size_gb * (1 << 30))
    assert res.capacity_bytes == cap and res.peak_bytes <= cap

    x = batched(inputs, res.batch)
    plan = plan_module(module, x, chip=hcd, precision="float16")
    ex, rec, _live = _measured(plan, x)
    assert rec.peak_bytes == plan.memory.peak_bytes <= cap
    torch.testing.assert_close(ex.run(x)[0], module(*x), rtol=2e-2, atol=2e-2)   # fp16 storage, fp32 accumulation
    ex.release()

    with pytest.raises(MemoryLimitError) as err:
        plan_module(module, batched(inputs, res.batch + 1), chip=hcd, precision="float16")
    e = err.value
    assert e.value > cap == e.limit and e.field == "memory.off_chip_memory.size_gb"
    msg = str(e)
    assert f"({e.value} B)" in msg and f"({cap} B" in msg and "largest buffers" in msg
    assert ("at step" in msg) or ("while uploading" in msg)
