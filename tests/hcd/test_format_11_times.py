"""A format-1.0 chip predicts exactly as before format 1.1 existed.

``data/format_10_times.json`` holds every step's predicted time (12 significant digits,
as the golden plans) of small zoo models planned on each bundled 1.0 chip, dumped by the
code of main *before* HCD 1.1 landed (commit 0fd8e39). The test replans and compares, and
also plans the same models on a 1.1 variant of each chip whose new fields are neutral
(every sustained fraction 1, launch 0): the new terms must vanish exactly.

Regenerate only after an intended change of a 1.0 price (a kernel's tiling, the cost
formula), and say so in the commit message:

    PYTHONPATH=$PWD .venv/bin/python -m tests.hcd.test_format_11_times --update
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "format_10_times.json"
MODELS = {"mlp": {}, "resnet18": {"image": 32}, "bert-base": {"layers": 1, "seq_len": 16, "num_heads": 4}}
CHIPS = ("DSP-M4", "EDGE-C2", "NPU-E1", "NPU-V2", "NPU-V3", "TFL-X1")
NEUTRAL = {"execution": {"launch_overhead_us": 0}}


def _chips() -> dict:
    from torchfl.hcd import load_hcd
    from torchfl.resources import bundled_hcds

    out = {}
    for path in bundled_hcds():
        hcd = load_hcd(path)
        if hcd.chip.name in CHIPS:
            out[hcd.chip.name] = hcd
    return out


def _neutral(hcd):
    """The same chip in format 1.1 with every new number neutral."""
    from torchfl.hcd import load_hcd_text
    import yaml

    data = hcd.canonical()
    for unit in ("fp16", "bf16", "fp32", "int8"):
        if unit in data["compute_units"]:
            data["compute_units"][unit]["sustained_fraction"] = 1.0
    data["memory"]["off_chip_memory"]["sustained_fraction"] = 1.0
    data.update(NEUTRAL)
    return load_hcd_text(yaml.safe_dump(data), f"<neutral {hcd.chip.name}>")


def _times(hcd, packs) -> dict:
    from tests.planner.planner_helpers import captured
    from torchfl.planner.api import plan_captured
    from torchfl.planner.errors import HardConstraintError, UnsupportedAttention
    from torchfl.planner.target import Target

    out = {}
    for model, options in MODELS.items():
        cap, x = captured(model, **options)
        try:
            plan = plan_captured(cap, x, Target.of(hcd, packs), precision="float16")
        except (HardConstraintError, UnsupportedAttention) as exc:
            out[model] = type(exc).__name__
            continue
        out[model] = [float(f"{s.predicted_time_s:.12g}") for s in plan.steps]
    return out


def dump() -> dict:
    from torchfl.planner.target import bundled_packs

    warnings.filterwarnings("ignore")
    packs = bundled_packs()
    return {name: _times(hcd, packs) for name, hcd in sorted(_chips().items())}


@pytest.fixture(scope="module")
def recorded():
    return json.loads(DATA.read_text())


@pytest.mark.parametrize("chip", CHIPS)
def test_format_10_chip_predicts_as_before(chip, recorded):
    from torchfl.planner.target import bundled_packs

    hcd = _chips()[chip]
    assert hcd.format_version == "1.0"
    packs = bundled_packs()
    now = _times(hcd, packs)
    assert now == recorded[chip]
    assert _times(_neutral(hcd), packs) == recorded[chip]


if __name__ == "__main__":
    if "--update" in sys.argv:
        DATA.write_text(json.dumps(dump(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {DATA}")
    else:
        print("differs" if dump() != json.loads(DATA.read_text()) else "same")
