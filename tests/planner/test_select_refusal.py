"""A model whose weights alone exceed the chip's off-chip memory is refused before the
candidates and the selection run (issue 34: LLaMA-2 70B float16 on an 80 GB chip was refused
only after a whole plan, about a minute), with the numbers and what to try; a model whose
weights fit still plans, and one whose activations do not fit is still refused by the plan's
memory check."""
import pytest
import torch
from torch import nn

from tests.planner.planner_helpers import hcd_variant
from torchfl.planner import plan_module
from torchfl.planner.memory import MemoryLimitError
from torchfl.planner.target import Target


def _chip(chips, mib):
    def edit(d):
        d["memory"]["off_chip_memory"]["size_gb"] = mib / 1024
    return Target.of(hcd_variant(chips["TFL-X1"], edit))


def _model(width=256):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)).eval()


@pytest.fixture
def searched(monkeypatch):
    """The selections and candidate generations that ran."""
    from torchfl.planner import candidates, select

    ran = []
    real_select, real_run = select.select, candidates.Generator.run
    monkeypatch.setattr(select, "select", lambda *a, **k: ran.append("select") or real_select(*a, **k))
    monkeypatch.setattr(candidates.Generator, "run", lambda self: ran.append("candidates") or real_run(self))
    return ran


def test_weights_over_the_chip_are_refused_before_the_search(chips, searched):
    x = torch.randn(4, 256)
    weights = 2 * (256 * 256 + 256) * 4                      # two float32 linears: 514 KiB
    with pytest.raises(MemoryLimitError) as info:
        plan_module(_model(), (x,), chip=_chip(chips, 0.25))
    assert searched == []                                    # neither candidates nor the DP ran
    err = info.value
    assert err.field == "memory.off_chip_memory.size_gb"
    assert err.limit == 256 * 1024 and err.value >= weights
    text = str(err)
    assert "parameters alone need" in text and "256.00 KiB" in text and "refused before planning" in text
    assert "int8" in text and "3 or more chips" in text and "off-chip memory" in text
    assert err.memory.breakdown()["parameter"] == err.value   # `plan memory` shows what does not fit
    assert err.memory.peak_step == -1 and not err.memory.fits


def test_weights_that_fit_plan_as_before(chips, searched):
    x = torch.randn(4, 256)
    plan = plan_module(_model(), (x,), chip=_chip(chips, 4))
    assert searched == ["candidates", "select"]
    assert plan.memory.fits and plan.memory.upload_bytes >= 2 * (256 * 256 + 256) * 4


def test_activations_over_the_chip_still_refused_by_the_plan(chips, searched):
    """Weights 8 KiB fit 0.25 MiB, a batch of 2048 rows of activations does not: the plan's own
    memory check refuses it, after the search."""
    x = torch.randn(2048, 32)
    with pytest.raises(MemoryLimitError) as info:
        plan_module(_model(32), (x,), chip=_chip(chips, 0.25))
    assert searched == ["candidates", "select"]
    assert "parameters alone" not in str(info.value) and "off_chip_memory.size_gb" in str(info.value)
