"""Issue 39's YAML faults as ``registry import`` meets them, on SQLite and a real PostgreSQL
server: a tagged value crashed the import with PyYAML's traceback; a name ending in a newline
validated and created a second chip ``DSP-M4\\n``; a null attention limit imported, and its
canonical form then failed validation. Each is refused, located, and nothing is imported."""

from __future__ import annotations

import pytest
from tests.registry.registry_gen import hcd_text

from torchfl.registry import ImportRefused


def _refused(reg, name: str, text: str) -> str:
    with pytest.raises(ImportRefused) as info:
        reg.import_texts([(name, text)])
    return "\n".join(str(d) for d in info.value.diagnostics)


@pytest.mark.parametrize("edit,path", [
    (("version: 1.0.0", "version: !!int '0.9.1'"), "chip.version"),
    (("memory_alignment_bytes: 256", "memory_alignment_bytes: !!bool ."), "constraints.memory_alignment_bytes"),
    (("count: 128", "count: 0x_"), "compute_units.fp16.count"),
    (("name: A-1", 'name: "A-1\\n"'), "chip.name"),
    (("max_sequence_length: 2048", "max_sequence_length: null"), "compute_units.attention.max_sequence_length"),
    (("version: 1.0.0", 'version: "1.0.0\\n"'), "chip.version"),
])
def test_bad_yaml_is_refused_by_import_and_nothing_is_written(reg, edit, path):
    text = hcd_text("A-1")
    assert edit[0] in text, edit
    report = _refused(reg, "bad.hcd", text.replace(edit[0], edit[1], 1))
    assert f"bad.hcd:" in report and f" {path}: " in report, report
    assert reg.chips() == []


def test_a_chip_name_with_a_newline_never_becomes_a_second_chip(reg):
    reg.import_texts([("a.hcd", hcd_text("A-1"))])
    _refused(reg, "b.hcd", hcd_text("A-1").replace("name: A-1", 'name: "A-1\\n"').replace("1.0.0", "1.1.0"))
    assert [c.name for c in reg.chips()] == ["A-1"]
