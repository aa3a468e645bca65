"""System descriptors in the registry (revision 0008): import, list, show, history, refusals,
on a real SQLite file and the real PostgreSQL (the ``registry_url`` fixture runs both)."""

from __future__ import annotations

import pytest
from tests.registry.registry_gen import hcd_text, write_hcds

from torchfl.hcd.system import load_system
from torchfl.registry import ImportRefused, NotFound
from torchfl.resources import bundled_hcds, bundled_systems

SYSTEM = """\
system:
  name: {name}
  version: {version}
chips:
  name: {chip}
  count: {count}
topology:
  kind: ring
  fabric: ici
  domain_chips: {count}
interconnect:
  links:
    count: 2
    bandwidth_gb_per_s: {bw}
sources:
  a:
    kind: assumption
    ref: "a test board"
provenance:
  interconnect.links.count: a
  interconnect.links.bandwidth_gb_per_s: a
"""


def system_text(name="BOARD-4", version="1.0.0", chip="A-1", count=4, bw=50):
    return SYSTEM.format(name=name, version=version, chip=chip, count=count, bw=bw)


def _files(tmp_path, specs):
    return write_hcds(tmp_path, specs)


def test_system_with_its_chip_in_one_import(reg, tmp_path):
    files = _files(tmp_path, [("a.hcd", hcd_text("A-1")), ("b.system.yaml", system_text())])
    result = reg.import_files(files)
    assert sorted((o.kind, o.name, o.status) for o in result.outcomes) == [("chip", "A-1", "added"),
                                                                          ("system", "BOARD-4", "added")]
    (listed,) = reg.systems()
    assert (listed.name, listed.latest, listed.chip, listed.chip_version, listed.count) == ("BOARD-4", "1.0.0",
                                                                                          "A-1", None, 4)
    assert listed.as_dict()["chip"] == "A-1"
    system = reg.system("BOARD-4")
    assert system.interconnect.links.bandwidth_gb_per_s == 50
    rec = reg.record("BOARD-4", kind="system")
    assert rec.content_hash == system.content_hash() and rec.source_text == system_text()
    assert reg.import_files(files).outcomes[1].status == "unchanged"


def test_unknown_chip_is_refused_and_nothing_is_written(reg, tmp_path):
    files = _files(tmp_path, [("c.hcd", hcd_text("C-1")), ("b.system.yaml", system_text(chip="C-2"))])
    with pytest.raises(ImportRefused) as err:
        reg.import_files(files)
    located = [str(d) for d in err.value.diagnostics if d.severity == "error"]
    assert located == [f"{files[1]}:5:9: error: chips.name: unknown chip 'C-2'; did you mean 'C-1'? Import its "
                       "HCD first (torchfl registry import FILE.hcd) or name a published chip"]
    assert reg.chips() == [] and reg.systems() == []      # the valid chip of the same import did not land


def test_versions_history_and_immutability(reg, tmp_path):
    reg.import_files(_files(tmp_path / "1", [("a.hcd", hcd_text("A-1")), ("s.system.yaml", system_text())]))
    reg.import_files(_files(tmp_path / "2", [("s.system.yaml", system_text(version="1.1.0", bw=40))]))
    assert [i.version for i in reg.history("BOARD-4", kind="system")] == ["1.0.0", "1.1.0"]
    assert reg.system("BOARD-4").interconnect.links.bandwidth_gb_per_s == 40
    assert reg.system("BOARD-4", "1.0.0").interconnect.links.bandwidth_gb_per_s == 50
    changes = {c.path for c in reg.diff("BOARD-4", "1.0.0", "1.1.0", kind="system")}
    assert "interconnect.links.bandwidth_gb_per_s" in changes and "system.version" in changes
    with pytest.raises(ImportRefused) as err:          # same version, other content
        reg.import_files(_files(tmp_path / "3", [("s.system.yaml", system_text(version="1.1.0", bw=30))]))
    assert err.value.conflicts
    with pytest.raises(NotFound, match="did you mean BOARD-4"):
        reg.system("BOARD-5")


def test_invalid_system_file_is_located_and_refused(reg, tmp_path):
    reg.import_files(_files(tmp_path, [("a.hcd", hcd_text("A-1"))]))
    (bad,) = _files(tmp_path, [("s.system.yaml", system_text(count=6).replace("domain_chips: 6", "domain_chips: 4"))])
    with pytest.raises(ImportRefused) as err:
        reg.import_files([bad])
    assert any(str(d).startswith(f"{bad}:10:17: error: topology.domain_chips: 6 chips") for d in err.value.diagnostics)
    assert reg.systems() == []


def test_seed_imports_the_bundled_systems(reg):
    result = reg.seed()
    names = {o.name for o in result.outcomes if o.kind == "system"}
    assert names == {load_system(p).name for p in bundled_systems()} >= {"HGX-A100-8", "HGX-H100-8", "MI300X-8",
                                                                          "NPU-V3-BOARD4"}
    assert len(reg.chips()) == len(bundled_hcds())
    npu = reg.system("NPU-V3-BOARD4")
    assert npu.interconnect_for(reg.chip("NPU-V3")).links.count == 2
    assert reg.chip_catalog()["NPU-V3"] == {"1.0.0": False}


def test_published_rows_refuse_update(reg, tmp_path):
    from sqlalchemy import text

    reg.import_files(_files(tmp_path, [("a.hcd", hcd_text("A-1")), ("s.system.yaml", system_text())]))
    with pytest.raises(Exception, match="immutable"):
        with reg._eng().begin() as conn:
            conn.execute(text("UPDATE system_versions SET chip_count = 5"))
    assert reg.system("BOARD-4").chips.count == 4


def test_the_transaction_checks_the_chip_again(reg, tmp_path):
    """The store refuses a system whose chip is missing even when the check before the
    transaction was passed (a chip gone in between): nothing of the import is written."""
    from torchfl.registry import store
    from torchfl.registry.documents import load_document

    (path,) = _files(tmp_path, [("s.system.yaml", system_text())])
    doc, _ = load_document(path)
    with pytest.raises(ImportRefused, match="names chip A-1, which the registry lacks"):
        with reg._write() as conn:
            store.write(conn, [doc], tool_version="test")
    assert reg.systems() == []
    with reg._read() as r:
        assert r.rows("SELECT COUNT(*) FROM imports") == [(0,)]
