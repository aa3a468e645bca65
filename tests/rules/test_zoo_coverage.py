"""The core pack covers the real graphs of the model zoo, and its rules bind their real calls.

Captures ResNet-50 (one bottleneck per stage: the same op set), BERT and GPT-2 (small
configs, built offline) the three ways the
planner does (``zoo_ops.py``): every ATen op found must have a rule in rules/core.yaml or
be listed in its ``no_rule:`` section. Then every node with a rule is matched, with its
real arguments, on a chip that can run float32 (TFL-X1): a rejection must be a guard
that excludes that call on purpose, never a binding or arity problem.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.rules import zoo_ops  # noqa: E402

from torchfl.hcd import load_hcd  # noqa: E402
from torchfl.resources import bundled_path  # noqa: E402
from tests.rules.calls import call_from_node  # noqa: E402
from torchfl.rules import load_pack  # noqa: E402
from torchfl.rules.matching import candidates  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("zoo")]
STRUCTURAL = {"getitem"}  # operator.getitem picks one output of a multi-output op; not an ATen op
# Rejections the core pack makes on purpose for these calls (the test asserts nothing else happens).
EXPECTED_GUARDS = {
    ("aten._to_copy.default", "dtype != none"),  # the second _to_copy rule serves dtype-free copies
    ("aten._to_copy.default", "dtype == none"),
    # the index-path cast rule serves casts to int32/int64/bool the chip does not list
    ("aten._to_copy.default", "dtype in ['int32', 'int64', 'bool'] and dtype not in chip.dtypes"),
    ("aten.convolution_backward.default", "output_mask[0]"),  # the first conv of a net needs no grad_input
}


@pytest.fixture(scope="module")
def graphs():
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(__file__).resolve().parents[2] / ".cache" / "inductor"))
    zoo_ops.FAILURES.clear()
    return list(zoo_ops.graphs(zoo_ops.zoo(small=True)))


def test_captures_ran(graphs):
    tags = {t for t, _ in graphs}
    for model in ("resnet50", "bert", "gpt2"):
        assert f"{model}/train-fw" in tags and f"{model}/train-bw" in tags, zoo_ops.FAILURES
        assert f"{model}/export-keep" in tags, zoo_ops.FAILURES


def test_every_zoo_op_has_a_rule_or_a_documented_reason(graphs):
    pack = load_pack(bundled_path("rules") / "core.yaml")
    covered = set(pack.ops) | {e.op for e in pack.no_rule} | STRUCTURAL
    seen = Counter()
    for tag, gm in graphs:
        for node in gm.graph.nodes:
            if node.op == "call_function":
                seen[zoo_ops.op_name(node.target)] += 1
    missing = sorted(set(seen) - covered)
    assert not missing, f"ops in the zoo graphs with neither a rule nor a no_rule entry: {missing}"
    for needed in ("aten.convolution.default", "aten.conv2d.default", "aten.addmm.default", "aten.mm.default",
                   "aten.bmm.default", "aten.linear.default", "aten._native_batch_norm_legit_no_training.default",
                   "aten.native_layer_norm.default", "aten.layer_norm.default", "aten.scaled_dot_product_attention.default",
                   "aten.embedding.default", "aten.convolution_backward.default",
                   "aten.max_pool2d_with_indices_backward.default"):
        assert needed in seen and needed in pack.ops, needed


def test_rules_bind_the_real_calls(graphs):
    pack = load_pack(bundled_path("rules") / "core.yaml")
    chip = load_hcd(bundled_path("hcd_registry") / "tfl_x1.hcd")  # stores and computes float32
    problems, matched = [], Counter()
    for tag, gm in graphs:
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            op = zoo_ops.op_name(node.target)
            if not pack.rules_for(op) or "val" not in node.meta:
                continue
            call = call_from_node(node)
            rank4 = hasattr(node.meta["val"], "dim") and node.meta["val"].dim() == 4
            outcomes = candidates(pack, chip, op, call, layout="NCHW" if rank4 else None)
            if any(m.ok for m in outcomes):
                matched[op] += 1
                continue
            for m in outcomes:
                for r in m.reasons:
                    if r.code == "guard" and (op, r.guard) in EXPECTED_GUARDS:
                        continue
                    if r.code == "dtype" and call.args and getattr(call.args[0], "dtype", "") in ("int64", "bool"):
                        continue  # index and mask tensors: the chip does not compute in them
                    problems.append(f"{tag} {node.name} {op}: {r.message}")
    assert not problems, "\n".join(problems[:40])
    for op in ("aten.convolution.default", "aten.addmm.default", "aten.scaled_dot_product_attention.default",
               "aten.native_layer_norm.default", "aten.embedding.default", "aten.convolution_backward.default",
               "aten._softmax.default", "aten.view.default", "aten.permute.default"):
        assert matched[op] > 0, op
