"""System descriptors (torchfl/hcd/system.py): the bundled files, and bad files located at
file:line:col with a way out."""

from __future__ import annotations

import pytest

from torchfl.hcd import load_hcd
from torchfl.hcd.system import SystemDescriptorError, check_system, check_system_text, load_system, load_system_text
from torchfl.resources import bundled_path

SYSTEMS = sorted((bundled_path("hcd_registry") / "systems").glob("*.system.yaml"))

GOOD = """\
system:
  name: TEST-H100-4
  version: 1.0.0
chips:
  name: H100-SXM5-80GB
  version: 1.3.0
  count: 4
topology:
  kind: all-to-all
  fabric: nvswitch
  domain_chips: 4
host:
  pcie_gen: 5
  lanes: 16
interconnect:
  links:
    bandwidth_gb_per_s: 20
sources:
  me:
    kind: assumption
    ref: "a slower board"
provenance:
  interconnect.links.bandwidth_gb_per_s: me
"""

CATALOG = {"H100-SXM5-80GB": {"1.2.0": True, "1.3.0": True}, "NPU-V3": {"1.0.0": False}}


def _hcd(name):
    return load_hcd(bundled_path("hcd_registry") / name)


def test_bundled_systems_are_valid_without_warnings():
    assert {p.name for p in SYSTEMS} >= {"hgx_a100_8.system.yaml", "hgx_h100_8.system.yaml",
                                         "mi300x_8.system.yaml", "npu_v3_board4.system.yaml"}
    for path in SYSTEMS:
        report = check_system(path)
        assert report.ok, [str(d) for d in report.diagnostics]
        assert report.diagnostics == [], [str(d) for d in report.diagnostics]


def test_overrides_win_and_the_rest_is_the_chips():
    system = load_system_text(GOOD, "t.system.yaml", CATALOG)
    hcd = _hcd("h100_sxm5_80gb.hcd")
    ic = system.interconnect_for(hcd)
    assert ic.links.bandwidth_gb_per_s == 20                       # the system's
    assert ic.links.count == hcd.interconnect.links.count          # the chip's
    assert ic.domain_chips == 4 and ic.fabric == "nvswitch"
    assert ic.sustained_fraction == hcd.interconnect.sustained_fraction
    assert system.host.gb_per_s == pytest.approx(16 * 3.938)
    assert system.content_hash() == load_system_text(GOOD + "\n# a comment\n").content_hash()


def test_npu_v3_board_states_links_the_chip_lacks():
    hcd = _hcd("npu_v3.hcd")
    assert hcd.interconnect is None
    system = load_system(bundled_path("hcd_registry") / "systems" / "npu_v3_board4.system.yaml")
    ic = system.interconnect_for(hcd)
    assert (ic.fabric, ic.links.count, ic.domain_chips) == ("ici", 2, 4)
    assert {system.kind_of(p) for p in system.provenance} == {"assumption"}


def _errors(text, catalog=None):
    report = check_system_text(text, "bad.system.yaml", catalog)
    assert not report.ok and report.system is None
    return [str(d) for d in report.diagnostics if d.severity == "error"]


def test_unknown_chip_is_located_with_did_you_mean():
    errs = _errors(GOOD.replace("name: H100-SXM5-80GB", "name: H100-SXM5-80G"), CATALOG)
    assert errs == ["bad.system.yaml:5:9: error: chips.name: unknown chip 'H100-SXM5-80G'; did you mean "
                    "'H100-SXM5-80GB'? Import its HCD first (torchfl registry import FILE.hcd) or name a "
                    "published chip"]


def test_unknown_version_lists_the_published_ones():
    errs = _errors(GOOD.replace("version: 1.3.0", "version: 9.0.0"), CATALOG)
    assert len(errs) == 1 and errs[0].startswith("bad.system.yaml:6:12: error: chips.version: chip H100-SXM5-80GB "
                                                 "has no version 9.0.0 (published: 1.2.0, 1.3.0)")


def test_unknown_key_did_you_mean():
    errs = _errors(GOOD.replace("  domain_chips: 4", "  domain_chip: 4"))
    assert any(e.startswith("bad.system.yaml:11:3: error: topology.domain_chip: unknown field 'domain_chip'; "
                            "did you mean 'domain_chips'?") for e in errs), errs


@pytest.mark.parametrize("count, word", [("-3", "must be >= 2"), ("eight", "expected an integer"),
                                         ("2.5", "expected an integer"), ("true", "expected an integer")])
def test_count_not_a_positive_int(count, word):
    errs = _errors(GOOD.replace("count: 4", f"count: {count}"))
    assert any(e.startswith("bad.system.yaml:7:10: error: chips.count: " + word) for e in errs), errs


def test_topology_inconsistent_with_count():
    errs = _errors(GOOD.replace("count: 4", "count: 6"))
    assert errs == ["bad.system.yaml:11:17: error: topology.domain_chips: 6 chips (chips.count) do not fill "
                    "fabric domains of 4: domain_chips must divide the count, e.g. 2 or 3 or 6"]


def test_torus_extents_must_multiply_to_a_domain():
    text = GOOD.replace("kind: all-to-all", "kind: torus-2d").replace("  domain_chips: 4", "  domain_chips: 4\n  dims: [2, 3]")
    errs = _errors(text)
    assert errs == ["bad.system.yaml:12:9: error: topology.dims: torus-2d extents 2x3 = 6 chips, but domain_chips "
                    "is 4; make the product equal domain_chips"]
    assert "add dims" in _errors(GOOD.replace("kind: all-to-all", "kind: torus-2d"))[0]
    assert "did you mean 'ring'" in _errors(GOOD.replace("kind: all-to-all", "kind: rings"))[0]


def test_chip_without_links_needs_the_systems():
    text = GOOD.replace("H100-SXM5-80GB", "NPU-V3").replace("  version: 1.3.0\n", "")
    errs = _errors(text, CATALOG)
    assert errs == ["bad.system.yaml:5:9: error: chips.name: chip NPU-V3 1.0.0 states no interconnect in its HCD: "
                    "this system must give interconnect.links.count (each with its source)"]


def test_unsourced_link_number_warns():
    report = check_system_text(GOOD.replace("provenance:\n  interconnect.links.bandwidth_gb_per_s: me\n", ""))
    assert report.ok
    assert any(d.severity == "warning" and d.path == "interconnect.links.bandwidth_gb_per_s"
               for d in report.diagnostics)


def test_bad_provenance_source_is_an_error():
    errs = _errors(GOOD.replace("bandwidth_gb_per_s: me", "bandwidth_gb_per_s: mee"))
    assert "unknown source 'mee'; did you mean 'me'?" in errs[0]


def test_load_raises_with_every_problem():
    with pytest.raises(SystemDescriptorError) as exc:
        load_system_text("system: 3\nchips: {}\n", "x.system.yaml")
    text = str(exc.value)
    assert "x.system.yaml:1:9: error: system: expected a mapping" in text
    assert "required field 'topology' is missing" in text
    with pytest.raises(SystemDescriptorError):
        load_system_text("- a list\n", "x.system.yaml")


def test_hcd_validate_of_a_system_says_what_it_is():
    from torchfl.hcd import check_hcd

    report = check_hcd(SYSTEMS[0])
    assert [d.message for d in report.diagnostics] == [
        "this is a system descriptor (N chips of an HCD), not an HCD: check it with `torchfl system validate FILE`"]
