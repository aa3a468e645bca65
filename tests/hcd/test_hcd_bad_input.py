"""Bad input gets a located, actionable error and never a traceback."""

from __future__ import annotations

import os
import resource
import time

import pytest

from torchfl.hcd import HCDError, check_hcd, check_hcd_text, load_hcd_text, located_yaml
from torchfl.hcd.diagnostics import YAMLLoadError
from torchfl.resources import bundled_path

SEED = (bundled_path("hcd_registry") / "npu_v3.hcd").read_text()


def first_error(report):
    errs = [d for d in report.diagnostics if d.severity == "error"]
    assert errs, report.diagnostics
    return errs[0]


def test_file_not_found(tmp_path):
    report = check_hcd(tmp_path / "missing.hcd")
    assert not report.readable and "no such file" in first_error(report).message


def test_directory(tmp_path):
    report = check_hcd(tmp_path)
    assert not report.readable and "directory" in first_error(report).message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_permission_denied(tmp_path):
    p = tmp_path / "x.hcd"
    p.write_text(SEED)
    p.chmod(0)
    report = check_hcd(p)
    assert not report.readable and "permission" in first_error(report).message


def test_not_utf8(tmp_path):
    p = tmp_path / "latin1.hcd"
    p.write_bytes(SEED.replace("FlagOS Certified", "FlagOS Certifi\xe9").encode("latin-1"))
    d = first_error(check_hcd(p))
    assert (d.line, d.column) == (4, 25) and "not valid UTF-8" in d.message


def test_binary_garbage(tmp_path):
    p = tmp_path / "garbage.hcd"
    p.write_bytes(b"chip:\n  name: \x00\x01\x02\xff\xfe")
    d = first_error(check_hcd(p))
    assert d.line == 2 and "binary" in d.message


def test_control_character():
    d = first_error(check_hcd_text("chip:\n  name: a\x07b\n"))
    assert d.line == 2 and "unreadable character" in d.message


def test_tabs():
    text = SEED.replace("  name: NPU-V3", "\tname: NPU-V3")
    d = first_error(check_hcd_text(text, "tabs.hcd"))
    assert d.line == 3 and "tab" in d.message and "spaces" in d.message


def test_non_mapping_root():
    d = first_error(check_hcd_text("- a\n- b\n"))
    assert (d.line, d.column) == (1, 1) and "is a list" in d.message


def test_empty_file():
    assert "empty" in first_error(check_hcd_text("")).message
    assert "empty" in first_error(check_hcd_text("# only a comment\n")).message


def test_invalid_yaml_syntax():
    d = first_error(check_hcd_text("chip:\n  name: [unclosed\nmemory: {}\n"))
    assert d.line == 3 and "invalid YAML" in d.message


def test_duplicate_keys():
    text = SEED.replace("  vendor: FlagOS Certified", "  vendor: FlagOS Certified\n  name: OTHER")
    d = first_error(check_hcd_text(text))
    assert (d.line, d.column, d.path) == (5, 3, "chip.name")
    assert "duplicate key 'name' (first defined at line 3)" in d.message


def test_object_tags_are_refused():
    # the other sections' absence is reported too (a refused value no longer hides the rest)
    text = "chip: !!python/object/apply:os.system ['echo pwned']\n"
    [d] = [d for d in check_hcd_text(text).diagnostics if d.path == "chip"]
    assert "not allowed" in d.message and d.severity == "error"
    text = "chip: !custom {a: 1}\n"
    [d] = [d for d in check_hcd_text(text).diagnostics if d.path == "chip"]
    assert "not allowed" in d.message


def test_merge_keys_refused():
    text = "base: &b {a: 1}\nchip:\n  <<: *b\n"
    assert any("merge keys" in d.message for d in check_hcd_text(text).diagnostics)


def test_small_alias_use_is_fine():
    doc = located_yaml("a: &x [1, 2]\nb: *x\n")
    assert doc.data == {"a": [1, 2], "b": [1, 2]}


def test_alias_bomb_refused_fast_and_small():
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        levels.append(f"a{i}: &a{i} [{refs}]")
    bomb = "\n".join(levels) + "\n"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.thread_time()     # this thread's CPU: wall time swings with the host's load
    report = check_hcd_text(bomb, "bomb.hcd")
    elapsed = time.thread_time() - start
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert "aliases" in first_error(report).message
    assert elapsed < 0.1, elapsed
    assert grown_kb < 20_000


def test_alias_expansion_bounded_below_alias_limit():
    # 2-way branching over 30 levels: few aliases, 2**30 values if expanded
    lines = ["l0: &l0 [x, x]"] + [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]" for i in range(1, 16)]
    start = time.thread_time()
    with pytest.raises(YAMLLoadError) as info:
        located_yaml("\n".join(lines) + "\n")
    assert time.thread_time() - start < 0.5
    assert "expands to more than" in str(info.value) or "aliases" in str(info.value)


def test_deep_nesting_refused():
    text = "a: " + "[\n" * 5000 + "]\n" * 5000
    assert "nesting" in first_error(check_hcd_text(text)).message
    text = "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 80)) + "  " * 80 + "leaf: 1\n"
    assert "nesting deeper than 64" in first_error(check_hcd_text(text)).message


def test_recursive_alias_refused():
    [d] = [d for d in check_hcd_text("a: &a [1, *a]\n").diagnostics if "recursive" in d.message]
    assert d.path == "a[1]" and (d.line, d.column) == (1, 11)


def test_file_over_one_mib(tmp_path):
    p = tmp_path / "big.hcd"
    p.write_text(SEED + "#" + "x" * (1 << 20) + "\n")
    d = first_error(check_hcd(p))
    assert "limit is 1,048,576 bytes" in d.message


def test_load_raises_project_error_with_all_diagnostics():
    text = SEED.replace("count: 256", "count: -256").replace("max_rank: 6", "max_rank: zero")
    with pytest.raises(HCDError) as info:
        load_hcd_text(text, "two.hcd")
    assert len([d for d in info.value.diagnostics if d.severity == "error"]) == 2
    assert "two.hcd:" in str(info.value)
