"""One resolved chip target serves planner and runtime: a chip given as an HCD object runs
on its own numbers (not on whatever the registry holds under its name), and a chip whose
numbers differ from the registry's under the same name and version is refused, loudly."""
import json

import pytest
import torch
from torch import nn

from torchfl.hcd import load_hcd_text
from torchfl.planner import ChipMismatch, plan_module, resolve_target
from torchfl.runtime import device
from torchfl.runtime.errors import PlanMismatch
from torchfl.runtime.executor import Executor

# fp16 storage, fp32 accumulation over K=32: |error| <= ~K * 2^-11 * |a||b| ~ 1e-2 relative at worst
FP16_TOL = dict(rtol=1e-2, atol=1e-2)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).eval()


def _variant(registry_url, edit):
    """The registry's NPU-V3 HCD, its canonical data edited."""
    data = json.loads(resolve_target("NPU-V3", registry_url).hcd.canonical_json())
    edit(data)
    return load_hcd_text(json.dumps(data), "variant.hcd")


def _reference(model, x):
    with torch.no_grad():
        return model.half()(x.half()).float()


def test_a_chip_given_as_an_hcd_not_in_the_registry_plans_and_runs_on_its_own_numbers(registry_url):
    def edit(d):
        d["chip"]["name"] = "NPU-V3-CUSTOM"
        d["memory"]["on_chip_cache"]["size_kb"] *= 2

    hcd = _variant(registry_url, edit)
    model, x = _mlp(), torch.randn(4, 32)
    plan = plan_module(model, (x,), chip=hcd, precision="float16")
    assert plan.chip == "NPU-V3-CUSTOM" and plan.chip_hash == hcd.content_hash()
    assert plan.target.model.cache_bytes == 2 * resolve_target("NPU-V3", registry_url).model.cache_bytes
    assert json.loads(plan.to_json())["chip_hash"] == hcd.content_hash()
    ex = Executor(plan)                       # runs on the plan's target: no registry lookup
    (y,) = ex.run((x,))
    torch.testing.assert_close(y, _reference(_mlp(), x), **FP16_TOL)
    assert device.device_memory(plan.target) is ex.memory
    assert device.max_memory_allocated(plan.target) > 0

    compiled = torch.compile(_mlp(), backend="torchfl", options={"chip": hcd, "precision": "float16"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), _reference(_mlp(), x), **FP16_TOL)


def test_same_name_and_version_with_other_numbers_is_a_mismatch(registry_url):
    registered = resolve_target("NPU-V3", registry_url)
    changed = _variant(registry_url, lambda d: d["memory"]["off_chip_memory"].update(bandwidth_gb_per_s=1.0))
    assert (changed.chip.name, str(changed.chip.version)) == (registered.name, registered.version)

    with pytest.raises(ChipMismatch, match=r"NPU-V3 .*differs from the one registry .*bump chip.version"):
        plan_module(_mlp(), (torch.randn(4, 32),), chip=changed, precision="float16", registry=registry_url)

    # planned on the modified chip (bundled packs, no registry): it never runs on the registry's chip
    plan = plan_module(_mlp(), (torch.randn(4, 32),), chip=changed, precision="float16")
    assert plan.chip_hash != registered.chip_hash
    with pytest.raises(PlanMismatch, match="same name with other numbers"):
        Executor(plan, registered)
    # a plan read back from JSON carries no target: the chip must be given, and is checked
    from torchfl.planner import Plan

    loaded = Plan.from_json(plan.to_json())
    with pytest.raises(PlanMismatch, match="carries no target"):
        Executor(loaded)
    with pytest.raises(PlanMismatch, match="HCD hash"):
        Executor(loaded, registered)


def test_one_target_per_chip_and_registry(registry_url):
    a = resolve_target("NPU-V3", registry_url)
    assert resolve_target("NPU-V3", registry_url) is a
    assert resolve_target(a) is a
    assert a.chip_hash == a.hcd.content_hash() and a.packs


def test_a_variant_model_of_a_chip_never_replaces_the_chips_memory(registry_url):
    """A ChipModel edited in place of its HCD (``dataclasses.replace``: same hash, other
    numbers, as the bf16-emulation probe makes) gets a memory of its own; the chip's memory
    stays the one its live tensors and the eager device hold. (It was replaced: the eager
    device then allocated on one memory and reported another, and an out-of-memory test
    that pinned the chip's capacity saw its allocation succeed.)"""
    import dataclasses

    from torchfl.planner.target import Target

    honest = resolve_target("NPU-V3", registry_url)
    mem = device.device_memory(honest)
    before = device.memory_allocated(honest)          # earlier tests' tensors may live on it
    buf = mem.alloc(256)
    lying = Target(honest.hcd, honest.packs, dataclasses.replace(honest.model, bf16_emulation=True))
    other = device.device_memory(lying)
    assert other is not mem and other.chip == lying.model
    assert device.device_memory(honest) is mem and device.device_memory(lying) is other
    assert device.memory_allocated(honest) == before + buf.accounted
    assert device.memory_allocated(lying) == other.memory_allocated()
    buf.free()
