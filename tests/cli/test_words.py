"""Words a user reads (issue 36): one strict-mode error, wherever strict mode refuses; the
known ops without a rule named; the kernel cache's own claims folder not counted as a checkout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchfl.planner.errors import StrictFallbackError
from torchfl.runtime.errors import FallbackNotAllowed

ROOT = Path(__file__).resolve().parents[2]


def _cli(args, tmp_path, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_")}
    env.update(XDG_DATA_HOME=str(tmp_path / "data"), PYTHONPATH=str(ROOT), **env_extra)
    return subprocess.run([sys.executable, "-m", "torchfl.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_one_strict_error_for_planner_executor_and_eager():
    assert FallbackNotAllowed is StrictFallbackError
    from torchfl.planner.plan import Fallback

    err = StrictFallbackError("NPU-V3", [Fallback("cummax", "aten.cummax.default", "no rule for aten.cummax")])
    text = str(err)
    assert text.startswith("strict mode: 1 op(s) have no kernel on NPU-V3")
    assert "aten::cummax (node cummax): no rule for aten.cummax" in text
    assert isinstance(err, RuntimeError) and err.fallbacks[0].node == "cummax"


def test_strict_planning_and_strict_executor_say_the_same(tmp_path):
    """Planner (strict=True) and executor (strict on a plan with fallbacks) raise the same
    class with the same sentence, as the eager device does (it calls the same constructor)."""
    import torch

    from torchfl.hcd import load_hcd
    from torchfl.planner import plan_module
    from torchfl.planner.target import Target
    from torchfl.resources import bundled_hcds, bundled_rule_packs
    from torchfl.rules import load_pack
    from torchfl.runtime.executor import Executor

    hcd = next(load_hcd(p) for p in bundled_hcds() if load_hcd(p).chip.name == "TFL-X1")
    target = Target.of(hcd, [load_pack(p) for p in bundled_rule_packs()])

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cummax(x, 0).values + 1

    x = torch.randn(8, 4)
    with pytest.raises(StrictFallbackError) as planned:
        plan_module(M(), (x,), chip=target, strict=True)
    plan = plan_module(M(), (x,), chip=target)
    assert plan.fallbacks
    with pytest.raises(StrictFallbackError) as executed:
        Executor(plan, strict=True)
    first = lambda e: str(e.value).splitlines()[0]      # noqa: E731
    assert first(planned) == first(executed) and "strict mode:" in first(planned)


def test_registry_ops_names_the_ops_without_a_rule(tmp_path):
    res = _cli(["registry", "ops", "--chip", "NPU-V3"], tmp_path)
    assert res.returncode == 0, res.stderr
    data = json.loads(_cli(["registry", "ops", "--chip", "NPU-V3", "--json"], tmp_path).stdout)
    names = [u["op"] for u in data["no_rule"]]
    assert names, "the bundled pack lists known ops without a rule"
    text = " ".join(res.stdout.split())
    assert f"{len(names)} known ops without a rule" in text
    assert all(n in text for n in names), (names, res.stdout[-800:])


def test_kernels_info_does_not_count_the_claims_folder(tmp_path):
    cache = tmp_path / "numba"
    (cache / ".claims").mkdir(parents=True)
    (cache / ".claims" / "x.claim").write_text("1")
    res = _cli(["kernels", "info", "--json"], tmp_path, NUMBA_CACHE_DIR=str(cache))
    assert res.returncode == 0, res.stderr
    text = _cli(["kernels", "info"], tmp_path, NUMBA_CACHE_DIR=str(cache)).stdout
    assert "other checkout dir" not in text, text
