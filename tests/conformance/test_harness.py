"""The conformance harness: tolerances, verdicts, a real run recorded as evidence, the CLI
(sharded run, report, evidence in `registry ops`, stale after a chip version change)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchfl.conformance.compare import compare, tolerance
from torchfl.conformance.harness import aggregate, verdict

ROOT = Path(__file__).resolve().parents[2]


def test_compare_checks_values_nan_inf_shape_and_dtype_at_the_stated_tolerance():
    e = torch.tensor([1.0, float("nan"), float("inf"), -2.0], dtype=torch.float16)
    assert compare(e.clone(), e).ok
    near = e.clone()
    near[0] = 1.0009765625   # one fp16 ulp above 1: inside rtol 2e-3
    assert compare(near, e).ok
    far = e.clone()
    far[3] = -2.5
    bad = compare(far, e)
    assert not bad.ok and "1 of 4 elements" in bad.detail and bad.max_abs_error == pytest.approx(0.5)
    nan_lost = e.clone()
    nan_lost[1] = 0.0
    assert not compare(nan_lost, e).ok                     # eager NaN must stay NaN
    inf_flipped = e.clone()
    inf_flipped[2] = float("-inf")
    assert not compare(inf_flipped, e).ok
    assert "shape" in compare(e[:3], e).detail and "dtype" in compare(e.float(), e).detail
    assert not compare(torch.tensor([1, 2]), torch.tensor([1, 3])).ok  # integers are exact
    # a 16-bit result may be judged against float64 too (eager rounds intermediates)
    exact = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert compare(torch.tensor([1.0, 2.0], dtype=torch.bfloat16), torch.tensor([1.0, 2.1], dtype=torch.bfloat16),
                   exact).ok
    assert tolerance("bfloat16", bf16_emulated=True) > tolerance("bfloat16") and tolerance("int8") == (0.0, 0.0)


def test_verdicts_and_attribution():
    assert [verdict(3, 0, 0), verdict(0, 0, 2), verdict(2, 1, 0), verdict(0, 1, 1), verdict(1, 0, 1)] == \
        ["pass", "refused", "partial", "fail", "partial"]
    from torchfl.conformance.harness import Unit

    unit = Unit("matmul", "float16", ("aten.bmm.default", "aten.mm.default"))

    def o(status, ops, reason=None, layout="contiguous"):
        return dict(case="matmul#0", variant="opinfo", layout=layout, status=status, ops=ops, reason=reason,
                    max_abs_error=0.0 if status != "refused" else None, max_rel_error=0.0, inputs={})

    outcomes = [o("pass", ["aten.mm.default"]), o("pass", ["aten.bmm.default"], layout="strided"),
                o("refused", ["aten.mm.default", "aten.squeeze.dims"], "squeeze (aten.squeeze.dims): no rule"),
                o("fail", ["aten.mm.default"], "1 of 4 elements outside"), o("skipped", [])]
    rows, skipped, unattributed = aggregate([(unit, outcomes)], {})
    by = {(r["op"], r["layout"]): r for r in rows}
    assert by[("aten.mm.default", "contiguous")]["verdict"] == "partial"
    assert by[("aten.mm.default", "contiguous")]["samples"] == 2          # the squeeze refusal is not mm's
    assert by[("aten.bmm.default", "strided")]["verdict"] == "pass"
    assert skipped == 1 and unattributed == 1


def test_a_run_records_evidence_that_ops_show_and_a_new_chip_version_makes_stale(seeded_url, tmp_path):
    from torchfl.conformance.harness import Settings, run
    from torchfl.registry import Registry

    reg = Registry(seeded_url)
    report = run("NPU-V3", registry=reg, settings=Settings(samples=2, edge_from=1, ops=("neg", "relu"),
                                                           dtypes=("float16",), jobs=1))
    assert report.run_id is not None
    counts = report.counts()
    assert counts["pass"] == 2 and counts["cases"] >= 4, report.as_dict()
    ev = reg.evidence(chip="NPU-V3")
    assert {e.op for e in ev} == {"aten.neg.default", "aten.relu.default"}
    assert {e.layout for e in ev} >= {"contiguous", "strided"} and all(e.verdict == "pass" for e in ev)
    assert all(e.identity.chip_hash == reg.identity("NPU-V3").chip_hash and not e.stale for e in ev)
    out = _cli(seeded_url, "registry", "ops", "--chip", "NPU-V3", "--json")
    ops = {o["op"]: o["evidence"] for o in json.loads(out)["ops"]}
    assert ops["aten.neg.default"]["state"] == "verified" and ops["aten.add.Tensor"]["state"] == "unverified"
    # a new version of the chip: the old evidence is stale until conformance runs again
    src = (ROOT / "hcd_registry" / "npu_v3.hcd").read_text()
    newer = tmp_path / "npu_v3_next.hcd"
    newer.write_text(src.replace("version: 1.0.0", "version: 1.0.1", 1).replace("size_kb: 8192", "size_kb: 4096", 1))
    reg.import_files([newer])
    ops = {o["op"]: o["evidence"] for o in json.loads(_cli(seeded_url, "registry", "ops", "--chip", "NPU-V3",
                                                           "--json"))["ops"]}
    assert ops["aten.neg.default"]["state"] == "stale"
    assert "chip NPU-V3 was 1.0.0, now 1.0.1" in ops["aten.neg.default"]["stale"]
    md = _cli(seeded_url, "conformance", "--report", "--format", "markdown", "--chip", "NPU-V3")
    assert "| `aten.neg.default` | stale |" in md
    # conformance again in this process (whose target cache holds 1.0.0): it runs on 1.0.1
    again = run("NPU-V3", registry=reg, settings=Settings(samples=1, edge_from=1, ops=("neg",),
                                                          dtypes=("float16",), jobs=1), record=False)
    assert again.identity.chip_version == "1.0.1" and again.counts()["pass"] == 1, again.as_dict()


def test_cli_runs_sharded_with_timestamped_progress_and_reports(tmp_path):
    """Two worker processes, lines on a pipe; the run is recorded and the matrix shows it."""
    from torchfl.registry import Registry

    url = f"sqlite:///{tmp_path / 'r.db'}"
    Registry(url).init(seed=True)
    proc = subprocess.run([sys.executable, "-m", "torchfl.cli", "conformance", "--registry", url, "--chip", "TFL-X1",
                           "--ops", "sigmoid,tanh", "--dtypes", "float32", "--samples", "2", "--jobs", "2"],
                          capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "TFL-X1 2/2" in proc.stderr and proc.stderr.lstrip().startswith("[")
    assert "2 verified" in proc.stdout and "recorded as run 1" in proc.stdout, proc.stdout
    text = _cli(url, "conformance", "--report", "--chip", "TFL-X1")
    assert "aten.sigmoid.default" in text and "TFL-X1:" in text and "2 verified" in text
    bad = subprocess.run([sys.executable, "-m", "torchfl.cli", "conformance", "--registry", url, "--chip", "NPU-V9"],
                         capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=120)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "NPU-V3" in bad.stderr


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _cli(url, *args) -> str:
    proc = subprocess.run([sys.executable, "-m", "torchfl.cli", *args[:1], "--registry", url, *args[1:]]
                          if args[0] == "registry" else [sys.executable, "-m", "torchfl.cli", *args, "--registry", url],
                          capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
