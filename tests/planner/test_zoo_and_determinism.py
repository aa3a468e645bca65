"""Every zoo model plans on every bundled chip (or fails with a hard-constraint error), plan
JSON is byte-identical across processes, the CLI's face works."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.planner.planner_helpers import captured
from torchfl.planner.api import plan_captured
from torchfl.planner.target import Target
from torchfl.planner.errors import HardConstraintError, UnsupportedAttention

ROOT = Path(__file__).resolve().parents[2]
# small configurations where the test allows: the graph's op kinds are those of the full models
ZOO = {
    "mlp": {},
    "resnet18": {"image": 64},
    "resnet50": {"image": 64},
    "bert-base": {"layers": 1, "seq_len": 32},
    "bert-large": {"layers": 1, "seq_len": 32},
    "gpt2": {"layers": 1, "seq_len": 32},
}


@pytest.mark.parametrize("model", sorted(ZOO))
def test_every_zoo_model_on_every_bundled_chip(model, chips, packs):
    cap, x = captured(model, **ZOO[model])
    outcomes = {}
    for name, hcd in chips.items():
        try:
            plan = plan_captured(cap, x, Target.of(hcd, packs), precision="float16")
        except (HardConstraintError, UnsupportedAttention) as exc:
            outcomes[name] = type(exc).__name__
            continue
        outcomes[name] = plan.summary.headline(name)
        assert plan.summary.nodes_total > 0 and plan.steps
        text, headline = plan.explain("text"), plan.summary.headline(name)
        assert text.split()[:len(headline.split())] == headline.split()   # first, wrapped at 120 columns
        assert max(len(line) for line in text.splitlines()) <= 120
        json.loads(plan.explain("json"))
        assert plan.explain("dot").startswith("digraph plan {")
        for step in plan.steps:  # every input is produced before it is read
            for v in step.inputs:
                assert not v or plan.values[v].producer is None or plan.values[v].producer < step.index
    assert any(not o.endswith("Error") and not o.endswith("Attention") for o in outcomes.values()), outcomes


SCRIPT = """
import hashlib, sys, warnings
warnings.filterwarnings("ignore")
from torchfl.planner.zoo import load_model
from torchfl.planner import plan_module
from torchfl.hcd import load_hcd
from torchfl.resources import bundled_path
m, x = load_model("resnet18", image=64)
plan = plan_module(m, x, chip=load_hcd(bundled_path("hcd_registry") / "npu_v3.hcd"), precision="float16")
sys.stdout.write(hashlib.sha256(plan.to_json().encode()).hexdigest())
"""


def test_plan_json_is_byte_identical_across_processes():
    digests = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_plan_json_round_trips(chips, packs):
    from torchfl.planner.plan import Plan

    cap, x = captured("resnet18", image=64)
    plan = plan_captured(cap, x, Target.of(chips["NPU-V3"], packs), precision="float16")
    assert Plan.from_json(plan.to_json()).to_json() == plan.to_json()
    assert hashlib.sha256(plan.to_json().encode()).hexdigest() == \
        hashlib.sha256(plan_captured(cap, x, Target.of(chips["NPU-V3"], packs), precision="float16").to_json().encode()).hexdigest()


def test_training_graphs_plan_forward_and_backward(chips):
    import torch
    from torch import nn

    from torchfl.planner.api import plan_training

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    fw, bw = plan_training(model, (torch.randn(8, 16),), chip=chips["TFL-X1"])
    assert fw.capture.training and bw.capture.training
    assert any(s.kernel == "matmul" for s in bw.steps)  # the weight gradients run as GEMMs on the chip
    assert bw.summary.nodes_total > fw.summary.nodes_total


def test_plan_graph_from_a_dynamo_backend(chips):
    import torch

    from torchfl.planner import plan_graph
    from torchfl.planner.zoo import load_model

    plans = []

    def backend(gm, example_inputs):
        plans.append(plan_graph(gm, example_inputs, chip=chips["NPU-V3"], precision="float16"))
        return gm.forward

    model, x = load_model("mlp", width=64)
    torch._dynamo.reset()
    out = torch.compile(model, backend=backend)(*x)
    assert out.shape == (8, 10) and len(plans) == 1
    plan = plans[0]
    assert plan.summary.fallbacks == 0 and plan.summary.nodes_on_chip == plan.summary.nodes_total
    names = {n.name for n in plan.capture.graph_module.graph.nodes}
    assert all(n in names for s in plan.steps for n in s.nodes)  # the plan names the re-captured graph
