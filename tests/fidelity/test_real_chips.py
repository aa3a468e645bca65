"""The bundled real accelerators: each validates with every number's source in a comment,
plans the small zoo and runs a model on the emulator with eager torch's result; the 1-D
GELU of the issue's table plans on them."""

from __future__ import annotations

import re

import pytest
import torch

from torchfl.hcd import check_hcd, load_hcd
from torchfl.resources import bundled_path

REAL = ("a100_sxm4_80gb", "h100_sxm5_80gb", "mi210", "mi300x", "gaudi2", "tpu_v5e", "ascend_910b",
        "jetson_agx_orin_64gb")
NUMBER = re.compile(r"^\s*[a-z_0-9]+:\s*-?[0-9][0-9.e+]*\s*(#.*)?$")


def _hcd(stem):
    return load_hcd(bundled_path("hcd_registry") / f"{stem}.hcd")


@pytest.mark.parametrize("stem", REAL)
def test_every_number_names_its_source_and_peaks_are_dense(stem):
    path = bundled_path("hcd_registry") / f"{stem}.hcd"
    report = check_hcd(path)
    assert report.ok and not report.diagnostics, [str(d) for d in report.diagnostics]
    text = path.read_text()
    for n, line in enumerate(text.splitlines(), 1):
        if NUMBER.match(line) and "version" not in line:
            assert "#" in line and re.search(r"\[[A-Z]+\]|CUDA C Programming Guide", line), f"{path.name}:{n}: {line}"
    h = report.hcd
    # the sparse figures are the trap FINDINGS.md names: H100 fp16 1979 is sparse, 989.5 dense
    if h.name == "H100-SXM5-80GB":
        assert h.compute_units.fp16.peak_tflops == 989.5 and h.compute_units.int8.peak_tops == 1979
    if h.name == "A100-SXM4-80GB":
        assert h.compute_units.fp16.peak_tflops == 312 and h.execution.launch_overhead_us > 0


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)).eval()


@pytest.mark.parametrize("stem", REAL)
def test_a_model_runs_on_the_emulated_real_chip(stem):
    from torchfl.planner.api import plan_module
    from torchfl.runtime.executor import Executor

    hcd = _hcd(stem)
    precision = "bfloat16" if "float16" not in hcd.dtypes else "float16"
    model, x = _mlp(), torch.randn(4, 64)
    plan = plan_module(model, (x,), chip=hcd, precision=precision)
    assert not plan.fallbacks and plan.summary.predicted_time_s > 0
    (y,) = Executor(plan, log=False).run((x,))
    with torch.no_grad():
        ref = model(x)
    tol = 2e-2 if precision == "bfloat16" else 5e-3          # relative to max |ref|: bf16 keeps 8 bits
    assert (y - ref).abs().max() / ref.abs().max() < tol


@pytest.mark.parametrize("stem", ["a100_sxm4_80gb", "mi210"])
def test_the_issue_rows_plan(stem):
    """Issue 32's table: a 1-D GELU of 1M values was refused for its 'batch'; a 4096x32 softmax
    was predicted at 0.26 us (no launch cost)."""
    from torchfl.fidelity.oneop import predict
    from torchfl.fidelity.tables import make_row
    from torchfl.planner.target import Target, bundled_packs

    hcd = _hcd(stem)
    t = Target.of(hcd, bundled_packs())
    gelu = predict(make_row(hcd.name, "gelu", "1048576", "float16", '{"approximate": "tanh"}', 2.8e-5, "s"), t)
    soft = predict(make_row(hcd.name, "softmax", "4096x32", "float16", "", 1.3e-5, "s"), t)
    assert gelu.predicted_s is not None and soft.predicted_s >= hcd.execution.launch_overhead_us * 1e-6
