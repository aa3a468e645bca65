"""PyTorch's OpInfo samples through ``torch.compile(backend="torchfl")``, strict, on every
bundled chip whose HCD allows the op (issue 17's OpInfo test module).

Target: every sample of every claimed op either matches eager torch (at the per-dtype
tolerance of ``torchfl/conformance/compare.py``) or is refused before execution with a
reason that names the HCD field or the rule; none falls back silently, none is wrong.

Coverage, bounded for CI (~45 compiled units, ~3 min of one core on a quiet machine): each
OpInfo the core pack's overloads map to (``torchfl/conformance/opinfos.py``) on one bundled
chip that claims one of them (chips taken in turn across OpInfos, so every chip is
covered), in one dtype (the chip's claimed float dtypes in turn), with the first OpInfo
sample and its edge variants (strided, channels-last, NaN/inf, empty, broadcast).
``TORCHFL_CONFORMANCE_FULL=1`` runs every (OpInfo, claiming chip) pair (~275 units); the
whole matrix with more samples is ``torchfl conformance``. ``torchfl conformance`` runs the same harness wider (all claimed
dtypes, more samples) and records the verdicts.
"""
from __future__ import annotations

import os
import re

import pytest

from torchfl.conformance.harness import Settings, Unit, claims
from torchfl.conformance.opinfos import opinfos_for
from torchfl.planner.target import bundled_packs

SETTINGS = Settings(samples=1, edge_from=1)


#: the reference chips the OpInfo shard rotates over: the real accelerators (issue 32) add no
#: rule or kernel path of their own (they are checked by tests/fidelity/test_real_chips.py), and
#: eight more chips would move every OpInfo to another chip at each addition
REFERENCE = ("dsp_m4", "edge_c2", "npu_e1", "npu_v2", "npu_v3", "tfl_x1")


def bundled_chips() -> dict:
    from torchfl.hcd import load_hcd
    from torchfl.resources import bundled_hcds

    return {h.chip.name: h for h in map(load_hcd, (p for p in bundled_hcds() if p.stem in REFERENCE))}
FLOATS = ("float16", "bfloat16", "float32")

#: a refusal must say which HCD field or which rule refuses the call
NAMES_FIELD_OR_RULE = re.compile(
    r"HCD field: |tensor\.|compute_units\.|constraints\.|memory\.|supported_dtypes|max_rank|max_batch|"
    r"max_sequence|num_heads=|not supported on|rules\[\d+\]|no rule for|guard |\(aten\.[\w.]+\): \w+: ")

#: a refusal may also be the kernel's own precondition, checked while planning: the strict
#: line reads ``node (aten.op): kernel: sentence``.
#: OpInfo case -> why it fails today; a case listed here that passes fails the test until the
#: entry goes. Every entry is listed in BENCHMARKS.md ("OpInfo conformance").
KNOWN_WRONG: dict[str, str] = {
    "narrow#1": "torch.export cannot capture narrow with a tensor start (data-dependent shape): CaptureError "
                "instead of a refusal or a fallback with a clear message (issue 17 item 4)",
}


def _units():
    out = []
    packs = bundled_packs()
    chips = sorted(bundled_chips().items())
    full = os.environ.get("TORCHFL_CONFORMANCE_FULL") == "1"
    names = sorted({o for _n, hcd in chips for o in opinfos_for(claims(hcd, packs, SETTINGS))})
    for n, (name, hcd) in enumerate(chips):
        claimed = claims(hcd, packs, SETTINGS)
        for opinfo, overloads in opinfos_for(claimed).items():
            k = names.index(opinfo)
            if not full and n != k % len(chips):
                continue   # CI shard: each OpInfo on one chip, in turn (see the module docstring)
            dtypes = [d for d in FLOATS if any(d in claimed[o] for o in overloads)]
            if not dtypes:
                continue
            dtype = dtypes[(n + k) % len(dtypes)]
            targets = tuple(o for o in overloads if dtype in claimed[o])
            out.append(pytest.param(name, Unit(opinfo, dtype, targets), id=f"{name}-{opinfo}-{dtype}"))
    return out


@pytest.mark.parametrize("chip,unit", _units())
def test_opinfo_samples_match_or_are_refused_by_name(chip, unit, seeded_url):
    from torchfl.conformance.harness import run_unit

    hcd = bundled_chips()[chip]
    outcomes = run_unit(unit, chip, seeded_url, SETTINGS, bool(hcd.constraints.bfloat16_emulation))
    ran = [o for o in outcomes if o["status"] != "skipped"]
    allowed_skips = ("eager torch rejects", "reached the chip", "Dynamo cannot trace")
    assert all(any(a in (o["reason"] or "") for a in allowed_skips) for o in outcomes if o["status"] == "skipped")
    wrong = []
    for o in ran:
        if o["status"] == "refused":
            assert NAMES_FIELD_OR_RULE.search(o["reason"]), f"{o['case']}: refusal names no HCD field or rule: " \
                                                            f"{o['reason']}"
            continue
        assert "fell back" not in (o["reason"] or ""), o
        if o["status"] == "fail" and o["case"] not in KNOWN_WRONG:
            wrong.append(f"{o['case']} [{o['layout']}]: {o['reason']} inputs {o['inputs']}")
    known = [o for o in ran if o["case"] in KNOWN_WRONG]
    for o in known:
        if o["status"] == "pass":
            pytest.fail(f"{o['case']} on {chip} now matches eager: remove it from KNOWN_WRONG")
    assert not wrong, "\n".join(wrong)
