"""Conformance over several chips in one run (issue 38): what no chip changes is made once
(Dynamo's trace, the planner's capture, eager torch's answers), and each chip still gets the
verdicts it gets alone."""
from __future__ import annotations

import pytest
import torch

CHIPS = ("NPU-V3", "EDGE-C2")   # EDGE-C2 takes NCWH only: it refuses what NPU-V3 runs


@pytest.fixture(scope="module")
def registry(seeded_url):
    from torchfl.registry import Registry

    return Registry(seeded_url)


def test_one_trace_and_one_capture_serve_every_chip(registry, monkeypatch):
    import torchfl.planner.capture as capture
    from torchfl.conformance.shared import GroupCompile

    calls = []
    real = capture.capture_dynamo
    monkeypatch.setattr(capture, "capture_dynamo", lambda *a, **k: calls.append(1) or real(*a, **k))
    a = torch.randn(2, 3, dtype=torch.float16)
    b = torch.randn(2, 3, dtype=torch.float16)
    group = GroupCompile(lambda x, y: torch.relu(x + y), [a, b], registry.url)
    results = {chip: group.run(chip) for chip in ("NPU-V3", "TFL-X1", "NPU-E1")}
    want = torch.relu(a + b)
    for chip, (got, plans, exc) in results.items():
        assert exc is None, exc
        assert [p.chip for p in plans] == [chip]
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    assert group.traces == 1 and len(calls) == 1


def test_a_chip_that_refuses_splits_alone_and_a_trace_error_is_every_chips(registry):
    from torchfl.conformance.shared import GroupCompile

    x = torch.randn(1, 3, 4, 4, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    group = GroupCompile(lambda t: t + 1, [x], registry.url)
    _got, plans, exc = group.run("NPU-V3")
    assert exc is None and plans
    _got, _plans, exc = group.run("EDGE-C2")   # NCWH only: the channels-last input is refused before capture
    from torchfl.conformance.execute import is_refusal

    assert exc is not None and is_refusal(exc), exc

    def untraceable(t):
        return torch.tensor(object())   # Dynamo cannot trace it

    bad = GroupCompile(untraceable, [x], registry.url)
    first = bad.run("NPU-V3")[2]
    assert first is not None and bad.run("TFL-X1")[2] is first


def test_several_chips_together_give_each_the_verdicts_it_gets_alone(registry):
    from torchfl.conformance.across import run_chips
    from torchfl.conformance.harness import Settings, run

    settings = Settings(samples=2, ops=("add", "permute"), jobs=1)
    alone = {chip: run(chip, registry=registry, settings=settings, record=False) for chip in CHIPS}
    together = {r.chip: r for r in run_chips(CHIPS, registry=registry, settings=settings, record=False)}
    for chip in CHIPS:
        a, b = alone[chip], together[chip]
        assert b.results == a.results and b.unverified == a.unverified
        assert (b.skipped, b.unattributed) == (a.skipped, a.unattributed)
        assert b.cpu_s is not None and b.cpu_s > 0
    # the two chips really differ, so the verdicts are each chip's own
    assert together["NPU-V3"].results != together["EDGE-C2"].results


def test_the_cli_runs_several_chips_together_and_records_each(registry):
    from click.testing import CliRunner

    from torchfl.cli.main import cli

    res = CliRunner().invoke(cli, ["conformance", "--chip", "NPU-V3", "--chip", "EDGE-C2", "--ops", "relu",
                                   "--samples", "1", "--jobs", "1", "--registry", registry.url])
    assert res.exit_code == 0, res.output
    assert res.output.count("a run of several chips") == 2 and res.output.count("recorded as run") == 2
    import re

    total = re.search(r"2 chips together: (\d+) chip-cases in (\d+) s, (\d+) s of CPU \(this process and its "
                      r"workers\), load average [\d.]+ -> [\d.]+", res.output)
    assert total and int(total.group(1)) > 0, res.output


def test_a_large_opinfo_is_cut_in_slices_with_the_verdicts_of_one_run_per_chip(registry, monkeypatch):
    """``--samples all``: max_pool2d's 1,448 float16 cases were one task of a third of the run;
    now slices of at most CHUNK cases (here 4, joint graphs of 2), largest units first, put
    back together per chip in order: the same rows as each chip alone."""
    import torchfl.conformance.across as across
    import torchfl.conformance.execute as execute
    from torchfl.conformance.harness import Settings, run

    monkeypatch.setattr(across, "CHUNK", 4)
    monkeypatch.setattr(execute, "JOINT_MAX", 2)
    settings = Settings(samples=7, ops=("add", "permute"), jobs=1)
    runs = {chip: across._start(registry, chip, settings) for chip in CHIPS}
    work = across.cross_units(runs, settings.modes, settings)
    parts = [u.part for u in work if u.opinfo == "add" and u.dtype == "float16"]
    assert len(parts) >= 2 and parts == sorted(parts) and parts[0][0] == 0
    assert all(b - a <= 4 for a, b in parts) and all(p[1] == q[0] for p, q in zip(parts, parts[1:]))
    assert [u.cost for u in work] == sorted((u.cost for u in work), reverse=True)
    alone = {chip: run(chip, registry=registry, settings=settings, record=False) for chip in CHIPS}
    together = {r.chip: r for r in across.run_chips(CHIPS, registry=registry, settings=settings, record=False)}
    for chip in CHIPS:
        a, b = alone[chip], together[chip]
        assert b.results == a.results and b.unverified == a.unverified
        assert (b.skipped, b.unattributed) == (a.skipped, a.unattributed)
        assert sum(r["samples"] for r in b.results) > 8
