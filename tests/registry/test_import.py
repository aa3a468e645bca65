"""Import: validation first, one transaction, immutability, packs, seeding."""

from __future__ import annotations

import json

import pytest
from tests.registry.registry_gen import hcd_text, pack_text, write_hcds

from torchfl.registry.names import HEAD
from torchfl.registry import ImportRefused, Registry
from torchfl.resources import bundled_hcds


def _count(reg) -> int:
    return sum(len(c.versions) for c in reg.chips())


def test_import_adds_then_identical_is_unchanged(reg, tmp_path):
    files = write_hcds(tmp_path, [("a.hcd", hcd_text("A-1")), ("b.hcd", hcd_text("B-1"))])
    first = reg.import_files(files)
    assert [o.status for o in first.outcomes] == ["added", "added"]
    again = reg.import_files(files)
    assert [o.status for o in again.outcomes] == ["unchanged", "unchanged"]
    assert _count(reg) == 2
    rec = reg.record("A-1")
    assert rec.source_text == hcd_text("A-1")
    from torchfl.hcd import load_hcd_text

    hcd = load_hcd_text(hcd_text("A-1"))
    assert rec.content_hash == hcd.content_hash()
    assert rec.canonical == hcd.canonical()
    assert json.dumps(rec.canonical, sort_keys=True, separators=(",", ":")) == hcd.canonical_json()


def test_changed_content_under_published_version_is_refused_naming_both_hashes(reg, tmp_path):
    (a,) = write_hcds(tmp_path / "v1", [("a.hcd", hcd_text("A-1", alignment=256))])
    (b,) = write_hcds(tmp_path / "v2", [("a.hcd", hcd_text("A-1", alignment=512))])
    (c,) = write_hcds(tmp_path / "v2", [("c.hcd", hcd_text("C-1"))])
    old = reg.import_files([a]).outcomes[0].content_hash
    with pytest.raises(ImportRefused) as err:
        reg.import_files([c, b])  # a valid new chip in the same command must not land either
    (conflict,) = err.value.conflicts
    message = str(conflict)
    assert old in message and conflict.new_hash in message and conflict.new_hash != old
    assert "bump chip.version" in message and "1.0.1" in message
    assert [c.name for c in reg.chips()] == ["A-1"]
    assert reg.record("A-1").content_hash == old


def test_invalid_file_means_nothing_is_written(reg, tmp_path):
    good = write_hcds(tmp_path, [(f"g{i}.hcd", hcd_text(f"G-{i}")) for i in range(3)])
    (bad,) = write_hcds(tmp_path, [("bad.hcd", hcd_text("BAD-1", alignment=300))])
    with pytest.raises(ImportRefused) as err:
        reg.import_files([*good, bad])
    assert err.value.exit_code == 1
    located = [str(d) for d in err.value.diagnostics if d.severity == "error"]
    assert located and all(d.startswith(f"{bad}:") for d in located)
    assert any("memory_alignment_bytes" in d and "power of two" in d for d in located)
    assert reg.chips() == []


def test_missing_and_unknown_files_are_reported_not_raised(reg, tmp_path):
    (odd,) = write_hcds(tmp_path, [("notes.txt", "hello")])
    (neither,) = write_hcds(tmp_path, [("x.yaml", "foo: 1\n")])
    with pytest.raises(ImportRefused) as err:
        reg.import_files([str(tmp_path / "absent.hcd"), odd, neither])
    text = "\n".join(str(d) for d in err.value.diagnostics)
    assert "no such file" in text and "unknown kind of file" in text and "neither a rule pack" in text
    assert reg.chips() == []


def test_same_version_twice_in_one_command(reg, tmp_path):
    same = write_hcds(tmp_path, [("a.hcd", hcd_text("A-1")), ("a_copy.hcd", hcd_text("A-1"))])
    assert len(reg.import_files(same).outcomes) == 1
    clash = write_hcds(tmp_path, [("b.hcd", hcd_text("B-1")), ("b2.hcd", hcd_text("B-1", alignment=512))])
    with pytest.raises(ImportRefused) as err:
        reg.import_files(clash)
    assert "different content" in str(err.value.diagnostics[0])
    with pytest.raises(ImportRefused, match="invalid"):
        reg.import_texts([("c.hcd", hcd_text("C-1")), ("c2.hcd", hcd_text("C-1", alignment=512))])
    assert [c.name for c in reg.chips()] == ["A-1"]


def test_versions_compare_as_semver(reg):
    versions = ["1.9.0", "1.10.0", "1.10.0-rc.1", "1.2.0", "1.10.0-alpha", "0.99.99"]
    reg.import_texts([(f"{v}.hcd", hcd_text("S-1", v, count=10 + i)) for i, v in enumerate(versions)])
    assert [i.version for i in reg.history("S-1")] == [
        "0.99.99", "1.2.0", "1.9.0", "1.10.0-alpha", "1.10.0-rc.1", "1.10.0"]
    assert reg.chips()[0].latest == "1.10.0"
    assert reg.chip("S-1").chip.version == "1.10.0"
    assert reg.chip("S-1", "1.9.0").compute_units.fp16.count == 10


def test_rule_packs_are_versioned_and_immutable(reg, tmp_path):
    v1, v2 = write_hcds(tmp_path, [("mini.yaml", pack_text("1.0.0")), ("mini2.yml", pack_text("1.1.0", "second"))])
    (chip,) = write_hcds(tmp_path, [("a.hcd", hcd_text("A-1"))])
    result = reg.import_files([v1, v2, chip])
    assert sorted((o.kind, o.name, o.version, o.status) for o in result.outcomes) == [
        ("chip", "A-1", "1.0.0", "added"), ("pack", "mini", "1.0.0", "added"), ("pack", "mini", "1.1.0", "added")]
    assert [(p.name, p.latest) for p in reg.packs()] == [("mini", "1.1.0")]
    assert reg.pack("mini").version == "1.1.0"
    assert reg.pack("mini", "1.0.0").rules[0].note == "first"
    assert [c.path for c in reg.diff("mini", "1.0.0", "1.1.0", kind="pack")] == ["pack.version", "rules"]
    (changed,) = write_hcds(tmp_path / "c", [("mini.yaml", pack_text("1.0.0", "edited"))])
    with pytest.raises(ImportRefused) as err:
        reg.import_files([changed])
    assert "bump pack.version" in str(err.value.conflicts[0])
    assert reg.import_files([v1]).outcomes[0].status == "unchanged"


def test_init_seeds_bundled_chips_idempotently(registry_url):
    with Registry(registry_url) as r:
        r.init(seed=True)
        names = {c.name for c in r.chips()}
        assert {"NPU-V2", "NPU-V3"} <= names and len(names) == len(bundled_hcds())
        again = r.init(seed=True)
        assert again["from"] == HEAD and again["seeded"]["added"] == 0


def test_semver_precedence_of_the_specification(reg):
    """semver.org §11's own example chain, stored shuffled, comes back in order; latest is the release."""
    chain = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11",
             "1.0.0-rc.1", "1.0.0", "2.0.0", "2.1.0", "2.1.1", "10.0.0"]
    shuffled = chain[5:] + chain[:5]
    reg.import_texts([(f"{v}.hcd", hcd_text("SPEC-1", v, count=1 + i)) for i, v in enumerate(shuffled)])
    assert [i.version for i in reg.history("SPEC-1")] == chain
    assert reg.chips()[0].latest == "10.0.0"


def test_an_import_that_names_no_file_is_an_error(reg, tmp_path, cli):
    # issue #20: `registry import EMPTY_DIR` (even one named x.hcd) said "0 added"
    with pytest.raises(ImportRefused, match="no file given"):
        reg.import_files([])
    (tmp_path / "x.hcd").mkdir()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImportRefused) as err:
        reg.import_files([tmp_path / "x.hcd", tmp_path / "empty"])
    assert [d.file for d in err.value.diagnostics] == [str(tmp_path / "empty"), str(tmp_path / "x.hcd")]
    assert all("nothing to import" in d.message for d in err.value.diagnostics)
    result = cli("import", str(tmp_path / "x.hcd"))
    assert result.exit_code == 1 and "nothing to import" in result.output
    assert reg.chips() == []
