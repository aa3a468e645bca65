"""Issue 39's YAML faults: each case once crashed the loader or slipped past validation.

Explicit tags and malformed numbers reached PyYAML's constructors (ValueError, KeyError,
IndexError tracebacks); a trailing newline passed the name regexes (``$`` matches before a
final ``\\n``); columns after a multi-byte character were byte offsets; an aliased value's
error pointed at the anchor; a duplicate key hid every other error; CR-only files were one
long line; a null attention limit validated.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchfl.hcd import check_hcd, check_hcd_text, located_yaml
from torchfl.hcd.diagnostics import YAMLLoadError
from torchfl.resources import bundled_path

SEED = (bundled_path("hcd_registry") / "npu_v3.hcd").read_text()


def errors(report):
    return [d for d in report.diagnostics if d.severity == "error"]


def edit(old: str, new: str) -> str:
    assert old in SEED, old
    return SEED.replace(old, new, 1)


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# Each of these raised inside PyYAML's constructors (9 signatures in the issue).
TAGGED = [
    ("version: 1.0.0", "version: !!int '0.9.1'", "chip.version", "!!int"),
    ("memory_alignment_bytes: 256", "memory_alignment_bytes: !!bool .", "constraints.memory_alignment_bytes", "!!bool"),
    ("default_layout: NHCW ", "default_layout: !!int + ", "tensor.default_layout", "!!int"),
    ("max_rank: 6", "max_rank: !!float x", "tensor.max_rank", "!!float"),
    ("max_rank: 6", "max_rank: !!float .", "tensor.max_rank", "!!float"),
    ("max_rank: 6", "max_rank: !!float _", "tensor.max_rank", "!!float"),
    ("max_rank: 6", "max_rank: !!int 0b", "tensor.max_rank", "!!int"),
    ("max_rank: 6", "max_rank: !!int 0x", "tensor.max_rank", "!!int"),
    ("max_rank: 6", "max_rank: !!int 0o", "tensor.max_rank", "!!int"),
    ("max_rank: 6", "max_rank: !!int ''", "tensor.max_rank", "!!int"),
    ("max_rank: 6", "max_rank: !!int 0:1", "tensor.max_rank", "!!int"),
    ("max_rank: 6", "max_rank: !<tag:yaml.org,2002:int> 1.5", "tensor.max_rank", "!!int"),
    ("max_rank: 6", "max_rank: !!bool ''", "tensor.max_rank", "!!bool"),
    ("max_rank: 6", "max_rank: !!null x", "tensor.max_rank", "!!null"),
    ("max_rank: 6", "max_rank: !!timestamp x", "tensor.max_rank", "!!timestamp"),
    ("max_rank: 6", "max_rank: !!python/tuple [1, 2]", "tensor.max_rank", "!!python/tuple"),
    ("max_rank: 6", "max_rank: !!int [1]", "tensor.max_rank", "!!int"),
    ("max_rank: 6", "max_rank: !!seq {a: 1}", "tensor.max_rank", "!!seq"),
    ("max_rank: 6", "max_rank: !!set {a}", "tensor.max_rank", "!!set"),
    ("max_rank: 6", "max_rank: !custom 6", "tensor.max_rank", "!custom"),
    ("count: 256", "count: 0b_", "compute_units.fp16.count", "not a valid number"),
    ("count: 256", "count: 0x_", "compute_units.fp16.count", "not a valid number"),
]


@pytest.mark.parametrize("old,new,path,word", TAGGED, ids=[t[1] for t in TAGGED])
def test_tags_and_bad_numbers_are_located_errors(old, new, path, word):
    text = edit(old, new)
    report = check_hcd_text(text, "t.hcd")  # raised ValueError/KeyError/IndexError before
    errs = errors(report)
    assert report.hcd is None and errs
    mine = [d for d in errs if d.path == path]
    assert len(mine) == 1, errs  # one problem, one diagnostic: validation does not repeat it
    assert word in mine[0].message
    assert mine[0].line == line_of(text, new.split(":")[0] + ":" + new.split(":", 1)[1][:3])
    assert mine[0].column == text.splitlines()[mine[0].line - 1].index(new.split(": ", 1)[1]) + 1


def test_tags_that_say_what_the_text_is_are_accepted():
    text = edit("max_rank: 6", "max_rank: !!int 6").replace("count: 256", "count: !!int '256'")
    text = text.replace("version: 1.0.0", "version: !!str 1.0.0")
    report = check_hcd_text(text)
    assert report.ok, report.diagnostics
    assert report.hcd.tensor.max_rank == 6 and report.hcd.compute_units.fp16.count == 256


def test_validate_cli_prints_one_line_per_tag_problem(tmp_path):
    bad = tmp_path / "tagged.hcd"
    bad.write_text(edit("version: 1.0.0", "version: !!int '0.9.1'")
                   .replace("memory_alignment_bytes: 256", "memory_alignment_bytes: !!bool ."))
    run = subprocess.run([sys.executable, "-m", "torchfl.cli", "hcd", "validate", str(bad)],
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    out = run.stdout + run.stderr
    assert "chip.version: '0.9.1' is tagged !!int" in out
    assert "constraints.memory_alignment_bytes: '.' is tagged !!bool" in out


@pytest.mark.parametrize("field,value", [("name", "DSP-M4"), ("device_type", "npu_v3"), ("version", "1.0.0")])
def test_trailing_newline_in_names_is_refused(field, value):
    old = {"name": "name: NPU-V3", "device_type": "device_type: npu_v3", "version": "version: 1.0.0"}[field]
    report = check_hcd_text(edit(old, f'{field}: "{value}\\n"'))
    assert [d.path for d in errors(report)] == [f"chip.{field}"], report.diagnostics


def test_trailing_newline_in_a_layout_is_refused():
    report = check_hcd_text(edit("default_layout: NHCW", 'default_layout: "NHCW\\n"'))
    assert "tensor.default_layout" in [d.path for d in errors(report)], report.diagnostics


@pytest.mark.parametrize("name", ["max_sequence_length", "supported_heads"])
def test_null_limit_on_an_enabled_attention_unit_is_refused(name):
    old = {"max_sequence_length": "max_sequence_length: 8192\n    supported",
           "supported_heads": "supported_heads: [1, 2, 4, 8, 16]"}[name]
    new = {"max_sequence_length": "max_sequence_length: null\n    supported",
           "supported_heads": "supported_heads: null"}[name]
    text = edit(old, new)
    errs = errors(check_hcd_text(text))
    assert [d.path for d in errs] == [f"compute_units.attention.{name}"], errs
    assert "enabled attention unit must state" in errs[0].message
    assert errs[0].line == line_of(text, f"{name}: null")


def test_column_after_multibyte_then_control_character_counts_characters():
    text = "chip:\n  vendor: \u00e9\u00e9\u00e9\u00e9\u00e9\x01x\n"
    with pytest.raises(YAMLLoadError) as info:
        located_yaml(text)
    d = info.value.diagnostics[0]
    assert (d.line, d.column) == (2, 16) and "U+0001" in d.message  # was 2:21 (bytes)


def test_column_after_multibyte_then_nul_counts_characters(tmp_path):
    p = tmp_path / "nul.hcd"
    p.write_bytes("chip:\n  vendor: \U0001f600\U0001f600\x00\n".encode())
    d = errors(check_hcd(p))[0]
    assert (d.line, d.column) == (2, 13), d  # was 2:19 (bytes)


def test_error_through_an_alias_points_at_the_alias_use():
    text = edit("max_batch_size: 512", "max_batch_size: *bad").replace("max_rank: 6", "max_rank: &bad -3")
    errs = errors(check_hcd_text(text))
    use = [d for d in errs if d.path == "constraints.max_batch_size"]
    assert len(use) == 1, errs
    assert use[0].line == line_of(text, "max_batch_size: *bad")  # was the anchor's line
    assert use[0].column == len("  max_batch_size: ") + 1
    anchor_line = line_of(text, "&bad")
    assert f"anchor &bad at line {anchor_line}" in use[0].message


def test_error_inside_an_aliased_mapping_points_at_the_alias_use():
    text = edit("  int8:\n    count: 512\n    peak_gops: 51.2            # TOPS, per the article\n",
                "  int8: *unit\n").replace("  fp16:\n", "  fp16: &unit\n").replace("count: 256", "count: -1")
    errs = [d for d in errors(check_hcd_text(text)) if d.path.startswith("compute_units.int8")]
    assert errs and all(d.line == line_of(text, "int8: *unit") for d in errs), errs


def test_duplicate_key_does_not_hide_other_errors():
    text = edit("max_rank: 6", "max_rank: 6\n  max_rank: 7").replace("max_batch_size: 512", "max_batch_size: -1")
    paths = {d.path for d in errors(check_hcd_text(text))}
    assert paths == {"tensor.max_rank", "constraints.max_batch_size"}, paths


def test_cr_only_line_endings_over_8kb():
    text = SEED.replace("\n", "\r") + ("# padding comment line\r" * 400)
    assert len(text) > 8192
    report = check_hcd_text(text)
    assert report.ok, report.diagnostics[:3]
    bad = text.replace("max_rank: 6", "max_rank: 0")
    d = errors(check_hcd_text(bad))[0]
    assert d.line == line_of(bad.replace("\r", "\n"), "max_rank: 0")


def test_merge_key_and_undefined_alias_and_duplicate_anchor_are_located():
    for text, word in [("a: &b {x: 1}\nc:\n  <<: *b\n", "merge keys"), ("a: *nope\n", "undefined alias"),
                       ("a: &x 1\nb: &x 2\n", "defined twice"), ("a: 1\n---\nb: 2\n", "another document")]:
        report = check_hcd_text(text)
        assert errors(report) and any(word in d.message for d in errors(report)), (text, report.diagnostics)


@pytest.mark.parametrize("text", ["a: 1\rb: 2\rc", "a: 1\nb", "--- \r", "x: [1,\n", "chip:\n  name: [x"])
def test_no_position_past_the_end_of_the_file(text):
    # libyaml puts the end of a stream without a final line break on the line after the last
    # (found by the fuzzer: "4 lines", error at 5:1)
    lines = text.replace("\r", "\n").split("\n")
    for d in check_hcd_text(text).diagnostics:
        assert d.line <= len(lines) and d.column <= len(lines[d.line - 1]) + 1, (d, lines)
