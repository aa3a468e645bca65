"""HCD format 1.2's ``interconnect:`` section (issue 49): validated like every section (located
errors, did-you-mean), its numbers under provenance, absent = the file as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchfl.hcd import check_hcd_text, load_hcd
from torchfl.resources import bundled_path

REG = Path(bundled_path("hcd_registry"))
BASE = (REG / "npu_v3.hcd").read_text()

GOOD = """
interconnect:
  fabric: nvswitch
  links:
    count: 12
    bandwidth_gb_per_s: 25
  domain_chips: 8
  sustained_fraction: 0.667
  latency_us: 0.47
  collective_overhead_us: 3.6
"""


def _check(extra: str):
    return check_hcd_text(BASE.rstrip("\n") + "\n" + extra.lstrip("\n"), "x.hcd")


def test_a_good_section_validates_and_gives_the_bus_bandwidth():
    r = _check(GOOD)
    assert r.ok, [str(d) for d in r.diagnostics]
    ic = r.hcd.interconnect
    assert ic.fabric == "nvswitch" and ic.links.count == 12 and ic.domain_chips == 8
    assert ic.bus_bytes_per_s == pytest.approx(12 * 25e9 * 0.667)
    assert r.hcd.format_version == "1.2"
    assert r.hcd.canonical()["interconnect"]["links"] == {"count": 12, "bandwidth_gb_per_s": 25}


def test_a_file_without_the_section_is_unchanged():
    plain = check_hcd_text(BASE, "x.hcd").hcd
    assert plain.interconnect is None and "interconnect" not in plain.canonical()
    assert plain.content_hash() == load_hcd(REG / "npu_v3.hcd").content_hash()
    assert plain.format_version != "1.2" or plain.sources


def _errors(r):
    return [d for d in r.diagnostics if d.severity == "error"]


def test_an_unknown_fabric_is_located_with_a_suggestion():
    r = _check(GOOD.replace("fabric: nvswitch", "fabric: nvswich"))
    [e] = _errors(r)
    text = BASE.rstrip("\n") + "\n" + GOOD.replace("nvswitch", "nvswich").lstrip("\n")
    line = text.splitlines().index("  fabric: nvswich") + 1
    assert (e.line, e.path) == (line, "interconnect.fabric")
    assert "did you mean 'nvswitch'" in e.message and "nvlink" in e.message


@pytest.mark.parametrize("bad,path,words", [
    ("    count: 12\n", "interconnect.links.count", "must be >= 1"),
    ("  domain_chips: 8\n", "interconnect.domain_chips", "must be >= 2"),
    ("  sustained_fraction: 0.667\n", "interconnect.sustained_fraction", "must be <= 1"),
])
def test_out_of_range_numbers_are_located(bad, path, words):
    replacement = {"interconnect.links.count": "    count: 0\n", "interconnect.domain_chips": "  domain_chips: 1\n",
                   "interconnect.sustained_fraction": "  sustained_fraction: 1.5\n"}[path]
    r = _check(GOOD.replace(bad, replacement))
    [e] = _errors(r)
    assert e.path == path and words in e.message and e.file == "x.hcd" and e.line > 1


def test_an_unknown_field_names_the_allowed_ones():
    r = _check(GOOD.replace("latency_us", "latency_usec"))
    [e] = _errors(r)
    assert e.path == "interconnect.latency_usec" and "did you mean 'latency_us'" in e.message


def test_a_missing_links_section_is_reported():
    r = _check(GOOD.replace("  links:\n    count: 12\n    bandwidth_gb_per_s: 25\n", ""))
    [e] = _errors(r)
    assert e.path == "interconnect.links" and "missing" in e.message


def test_in_a_12_file_an_interconnect_number_without_provenance_warns_and_a_wrong_path_errs():
    src = ("sources:\n  ds:\n    kind: datasheet\n    ref: \"a datasheet\"\n"
           "provenance:\n  interconnect.links.count: ds\n  interconnect.link.bandwidth_gb_per_s: ds\n")
    r = _check(GOOD + src)
    warned = {d.path for d in r.diagnostics if d.severity == "warning"}
    assert "interconnect.latency_us" in warned and "interconnect.links.count" not in warned
    [e] = _errors(r)
    assert "interconnect.link.bandwidth_gb_per_s" in e.path and "did you mean" in e.message


def test_a_collective_microbenchmark_is_a_known_benchmark():
    src = ("sources:\n  nccl:\n    kind: microbenchmark\n    benchmark: collective-bandwidth\n    ref: \"nccl-tests\"\n"
           "provenance:\n  interconnect.sustained_fraction: nccl\n")
    r = _check(GOOD + src)
    assert r.ok and r.hcd.kind_of("interconnect.sustained_fraction") == "microbenchmark"


LINKED = ("a100_sxm4_80gb", "h100_sxm5_80gb", "mi300x", "gaudi2", "tpu_v5e")


@pytest.mark.parametrize("stem", LINKED)
def test_every_bundled_link_number_states_its_source(stem):
    hcd = load_hcd(REG / f"{stem}.hcd")
    assert hcd.interconnect is not None
    for path in ("interconnect.links.count", "interconnect.links.bandwidth_gb_per_s",
                 "interconnect.sustained_fraction", "interconnect.latency_us", "interconnect.collective_overhead_us"):
        assert hcd.kind_of(path) in ("datasheet", "microbenchmark", "assumption"), (stem, path)
    assert hcd.kind_of("interconnect.links.bandwidth_gb_per_s") == "datasheet"


def test_the_datasheet_link_rates():
    a100, h100 = (load_hcd(REG / f"{s}.hcd").interconnect for s in ("a100_sxm4_80gb", "h100_sxm5_80gb"))
    assert a100.links.count * a100.links.bandwidth_gb_per_s == 300    # 600 GB/s bidirectional
    assert h100.links.count * h100.links.bandwidth_gb_per_s == 450    # 900 GB/s bidirectional
