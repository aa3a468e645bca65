"""Issue 52 case 5: whatever validates plans to a finite, sane time. Before:
``sustained_fraction: 5.0e-324`` (or 1e-320) validated and imported, then planning failed
("cannot plan node relu ... none can be chained": an infinite time); 1e-300 predicted 5.4e292 s
for one linear; ``1e-300`` written without a dot was refused as "expected a number" (YAML 1.1).
Now a sustained share is bounded below (>= 1e-3, documented in the schema), a number written
YAML 1.2 style (1e-3) is a number, non-finite numbers are refused, and an HCD at every bound plans
a model to a finite positive time."""

from __future__ import annotations

import math

import pytest
import torch

from torchfl.hcd import check_hcd_text, load_hcd_text
from torchfl.resources import bundled_path

SEED = (bundled_path("hcd_registry") / "npu_v3.hcd").read_text()
PEAK = "    peak_gflops: 25.6          # TFLOPS, per the article"


def with_sustained(fp16: str = "0.9", mem: str = "0.8") -> str:
    text = SEED.replace(PEAK, f"{PEAK}\n    sustained_fraction: {fp16}")
    return text.replace("    bandwidth_gb_per_s: 128\n", f"    bandwidth_gb_per_s: 128\n    sustained_fraction: {mem}\n")


def errors(text):
    return [d for d in check_hcd_text(text, "chip.hcd").diagnostics if d.severity == "error"]


@pytest.mark.parametrize("value", ["5.0e-324", "1e-320", "1.0e-300", "1e-300", "0.0009", "0"])
@pytest.mark.parametrize("where", ["fp16", "mem"])
def test_tiny_sustained_fractions_are_refused_at_their_line(value, where):
    found = errors(with_sustained(**{where: value}))
    assert len(found) == 1, [str(d) for d in found]
    d = found[0]
    assert d.line == (11 if where == "fp16" else 26), str(d)
    assert "must be >= 0.001" in d.message, str(d)


@pytest.mark.parametrize("text, value", [("1e-3", 0.001), ("5E-1", 0.5), ("+1e0", 1.0), ("2.5e-1", 0.25)])
def test_yaml_12_exponents_are_numbers(text, value):
    hcd = load_hcd_text(with_sustained(fp16=text), "chip.hcd")
    assert hcd.compute_units.fp16.sustained_fraction == value


def test_a_quoted_exponent_stays_text():
    (d,) = errors(with_sustained(fp16='"1e-3"'))
    assert "expected a number" in d.message


FLOAT_FIELDS = [
    ("    peak_gflops: 25.6          # TFLOPS, per the article", "    peak_gflops: {v}"),
    ("    bandwidth_gb_per_s: 256", "    bandwidth_gb_per_s: {v}"),
    ("    bandwidth_gb_per_s: 128", "    bandwidth_gb_per_s: {v}"),
    ("    peak_gops: 51.2            # TOPS, per the article", "    peak_gops: {v}"),
]


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1e400", "-1e-3"])
@pytest.mark.parametrize("old, new", FLOAT_FIELDS)
def test_non_finite_or_negative_rates_are_refused(old, new, value):
    assert old in SEED
    found = errors(SEED.replace(old, new.format(v=value)))
    assert len(found) == 1, [str(d) for d in found]


def test_schema_documents_the_sustained_bound():
    from torchfl.hcd.schema import hcd_json_schema

    defs = hcd_json_schema()["$defs"]
    for unit in ("FloatUnit", "IntUnit", "OffChipMemory"):
        prop = defs[unit]["properties"]["sustained_fraction"]
        assert prop["anyOf"][0].get("minimum") == 0.001 and prop["anyOf"][0].get("maximum") == 1
        assert "0.001 <= f <= 1" in prop["description"]


WORST = """\
chip: {name: WORST-X, vendor: tests, version: 1.0.0, device_type: worst_x}
compute_units:
  fp32: {count: 1, peak_tflops: 1e-6, sustained_fraction: 1e-3}
  fp16: {count: 1, peak_tflops: 1e-6, sustained_fraction: 1e-3}
memory:
  on_chip_cache: {size_kb: 1, bandwidth_gb_per_s: 1e-6}
  off_chip_memory: {bandwidth_gb_per_s: 1e-6, sustained_fraction: 1e-3}
tensor: {max_rank: 6, supported_dtypes: [torch.float32, torch.float16], default_layout: NCHW}
constraints: {max_batch_size: 512, max_sequence_length: 8192, memory_alignment_bytes: 1048576}
execution: {launch_overhead_us: 1e6, matrix_launch_overhead_us: 1e6, concurrent_tiles: 1, tile_elements: 1}
"""

BEST = """\
chip: {name: BEST-X, vendor: tests, version: 1.0.0, device_type: best_x}
compute_units:
  fp32: {count: 1000000, peak_tflops: 1e5, sustained_fraction: 1}
  fp16: {count: 1000000, peak_tflops: 1e5, sustained_fraction: 1}
memory:
  on_chip_cache: {size_kb: 67108864, bandwidth_gb_per_s: 1e6}
  off_chip_memory: {bandwidth_gb_per_s: 1e6, sustained_fraction: 1}
tensor: {max_rank: 6, supported_dtypes: [torch.float32, torch.float16], default_layout: NCHW}
constraints: {max_batch_size: 512, max_sequence_length: 8192, memory_alignment_bytes: 1}
execution: {launch_overhead_us: 0, concurrent_tiles: 16777216, tile_elements: 1073741824}
"""


@pytest.mark.parametrize("text", [WORST, BEST], ids=["worst", "best"])
def test_a_chip_at_every_bound_plans_to_a_finite_time(text):
    """The slowest and the fastest chip the bounds admit: both plan a linear + relu, every
    step's time finite and positive, the worst one's under a year."""
    from torchfl.planner.api import plan_module

    hcd = load_hcd_text(text, "bounds.hcd")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
    plan = plan_module(model, (torch.randn(8, 64),), hcd)
    t = plan.summary.predicted_time_s
    assert math.isfinite(t) and 0 < t < 3.2e7, t


def test_whatever_validates_plans_to_a_finite_time():
    """Random numbers (any magnitude, written any way YAML reads) in every performance field:
    either validation refuses the file, or a linear + relu plans to a finite positive time."""
    from hypothesis import HealthCheck, example, given, settings
    from hypothesis import strategies as st

    from torchfl.hcd.diagnostics import HCDError
    from torchfl.planner.api import plan_module

    def spelled(x: float) -> str:
        return repr(x) if "e" in repr(x) or x != x or x in (float("inf"), float("-inf")) else f"{x:e}"

    num = st.one_of(st.floats(allow_nan=False, allow_infinity=False, min_value=1e-320, max_value=1e7),
                    st.sampled_from([5e-324, 1e-300, 1e-3, 1.0, 1e5])).map(spelled)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
    x = torch.randn(4, 16)
    planned = []

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @example(peak="1e-6", sf="1e-3", bw="1e-6", msf="1e-3", cache_bw="1e-6", launch="1e6")   # the slowest
    @example(peak="1.0e5", sf="1", bw="1e6", msf="1", cache_bw="1e6", launch="0")        # the fastest
    @given(peak=num, sf=num, bw=num, msf=num, cache_bw=num, launch=num)
    def check(peak, sf, bw, msf, cache_bw, launch):
        text = WORST.replace("fp32: {count: 1, peak_tflops: 1e-6, sustained_fraction: 1e-3}",
                             f"fp32: {{count: 1, peak_tflops: {peak}, sustained_fraction: {sf}}}")
        text = text.replace("on_chip_cache: {size_kb: 1, bandwidth_gb_per_s: 1e-6}",
                            f"on_chip_cache: {{size_kb: 1, bandwidth_gb_per_s: {cache_bw}}}")
        text = text.replace("off_chip_memory: {bandwidth_gb_per_s: 1e-6, sustained_fraction: 1e-3}",
                            f"off_chip_memory: {{bandwidth_gb_per_s: {bw}, sustained_fraction: {msf}}}")
        text = text.replace("launch_overhead_us: 1e6", f"launch_overhead_us: {launch}")
        try:
            hcd = load_hcd_text(text, "fuzz.hcd")
        except HCDError:
            return
        planned.append(1)
        t = plan_module(model, (x,), hcd).summary.predicted_time_s
        assert math.isfinite(t) and t > 0, (t, peak, sf, bw, msf, cache_bw, launch)

    check()
    assert planned, "no example validated: the fuzz checked nothing"
