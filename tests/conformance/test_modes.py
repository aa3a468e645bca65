"""Conformance sees what users see (issue 33 item 4): every OpInfo sample (``--samples all``),
the npu eager device (``--mode eager``), a run summary that agrees with the stored report,
and the native-bfloat16 check (a chip whose kernels compute bf16 through fp16 is flagged)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from torchfl.conformance.harness import Report, Settings, op_states


def test_summary_counts_follow_the_registry_claim_state():
    """Per overload, the run's summary word is the state ``--report`` shows for the same rows:
    pass + refused in two layouts is partial (it was 'refused', the report said 'partial')."""
    from torchfl.registry.evidence import claim_state  # noqa: F401  (the rule op_states applies)

    rows = [dict(op="aten.a", verdict="pass"), dict(op="aten.a", verdict="refused"),
            dict(op="aten.b", verdict="fail"), dict(op="aten.b", verdict="refused"),
            dict(op="aten.c", verdict="pass"), dict(op="aten.c", verdict="fail"),
            dict(op="aten.d", verdict="refused"), dict(op="aten.e", verdict="pass")]
    assert op_states(rows) == {"aten.a": "partial", "aten.b": "failing", "aten.c": "partial",
                               "aten.d": "refused", "aten.e": "verified"}
    r = Report.__new__(Report)
    r.results = [dict(row, samples=1) for row in rows]
    r.unverified = [("aten.f", "float16")]
    assert r.counts() == {"pass": 1, "partial": 2, "fail": 1, "refused": 1, "unverified": 1, "cases": 8}


def test_samples_all_draws_every_opinfo_sample():
    from torchfl.conformance.cases import opinfo_cases
    from torchfl.conformance.opinfos import lookup

    n = sum(1 for _ in lookup("add").sample_inputs("cpu", torch.float16, requires_grad=False))
    assert n > 4
    assert len(opinfo_cases("add", torch.float16, samples=None, edge_from=0)) == n
    assert len(opinfo_cases("add", torch.float16, samples=2, edge_from=0)) == 2


def test_cli_samples_option_takes_a_count_or_all():
    from click.testing import CliRunner

    from torchfl.cli.main import cli

    res = CliRunner().invoke(cli, ["conformance", "--chip", "NPU-V3", "--samples", "many", "--no-record"])
    assert res.exit_code == 2 and "neither a positive count nor 'all'" in res.output


def test_run_summary_and_report_agree(seeded_url):
    """A real run (all samples of a few overloads, several layouts) and the matrix read back."""
    from torchfl.conformance import matrix
    from torchfl.conformance.harness import run
    from torchfl.registry import Registry

    reg = Registry(seeded_url)
    report = run("NPU-V2", registry=reg, settings=Settings(samples=None, edge_from=1, ops=("neg", "relu", "mm"),
                                                           dtypes=("float16",), jobs=1))
    c = report.counts()
    assert c["cases"] > 10
    totals = matrix.build(reg, ["NPU-V2"])["totals"]["NPU-V2"]
    ran = op_states(report.results)
    shown = {r["op"]: r["cells"]["NPU-V2"]["state"] for r in matrix.build(reg, ["NPU-V2"])["ops"] if r["op"] in ran}
    assert shown == ran
    assert (c["pass"], c["partial"], c["fail"], c["refused"]) == \
        (totals["verified"], totals["partial"], totals["failing"], totals["refused"])


def test_eager_mode_runs_the_cases_on_the_npu_device(seeded_url, monkeypatch):
    """``--mode eager``: the same OpInfo cases on npu tensors (TFL-X1 is one of the session's
    devices), strict; evidence stored under 'eager <layout>' beside the compiled rows."""
    from torchfl.conformance.harness import run
    from torchfl.registry import Registry

    monkeypatch.setenv("TORCHFL_REGISTRY_URL", seeded_url)
    reg = Registry(seeded_url)
    report = run("TFL-X1", registry=reg, settings=Settings(samples=3, edge_from=1, ops=("neg", "relu"),
                                                           dtypes=("float32",), jobs=1,
                                                           modes=("compile", "eager")))
    eager = [r for r in report.results if r["layout"].startswith("eager ")]
    assert {r["op"] for r in eager} == {"aten.neg.default", "aten.relu.default"}
    assert {r["layout"] for r in eager} >= {"eager contiguous", "eager strided"}
    assert all(r["verdict"] == "pass" for r in report.results), [r for r in report.results if r["verdict"] != "pass"]
    stored = {(e.op, e.layout) for e in reg.evidence(chip="TFL-X1")}
    assert ("aten.neg.default", "eager contiguous") in stored and ("aten.neg.default", "contiguous") in stored


def test_native_bf16_check_flags_kernels_that_emulate_it():
    """A chip that lists bfloat16 natively but whose kernels go through float16 is flagged;
    an honest chip is not, and one that declares the emulation is not probed."""
    from torchfl.conformance.bf16 import check_native_bf16
    from torchfl.hcd import load_hcd
    from torchfl.planner.target import Target
    from torchfl.resources import bundled_path

    honest = Target.of(load_hcd(bundled_path("hcd_registry") / "tfl_x1.hcd"))
    assert check_native_bf16(honest) == []
    lying = Target(honest.hcd, honest.packs, dataclasses.replace(honest.model, bf16_emulation=True))
    found = check_native_bf16(lying)
    assert found and {f.op for f in found} >= {"aten.mul.Tensor"}
    msg = found[0].message
    assert "claims native bfloat16" in msg and "constraints.bfloat16_emulation" in msg and "inf" in msg
    declared = Target.of(load_hcd(bundled_path("hcd_registry") / "npu_e1.hcd"))
    assert check_native_bf16(declared) == []
