"""Issue #20 for rule packs: every number and list has a plausible range, huge numbers are
located errors (never a traceback), and an unbounded guard is refused where it is written."""

from __future__ import annotations

import pytest

from torchfl.rules import check_pack_text

PACK = """\
pack:
  name: demo
  version: 1.2.3
rules:
  - op: aten.relu.default
    kernel: relu
    args: {self: tensor}
    requires: {layouts: chip}
    guards: ["rank >= 1"]
    bind: {a: self}
"""


def errors(text):
    report = check_pack_text(text, "p.yaml")
    out = [d for d in report.diagnostics if d.severity == "error"]
    assert out and not report.ok and all(d.line >= 1 and d.column >= 1 for d in out), report.diagnostics
    return out


def test_the_base_pack_is_valid():
    assert check_pack_text(PACK, "p.yaml").ok


@pytest.mark.parametrize("edit, line, words", [
    # a 4,301-digit integer crashed the loader (Python's int-to-string limit)
    (("    bind: {a: self}", "    bind: {a: self, alpha: " + "1" * 4301 + "}"), 10, "4,301 digits"),
    (("    bind: {a: self}", "    bind: {a: self, alpha: 0x" + "f" * 5000 + "}"), 10, "digits"),
    (("    bind: {a: self}", "    bind: {a: self, alpha: .inf}"), 10, "finite"),
    (("rank >= 1", "rank >= 1e999"), 9, "beyond the largest float"),
    (("rank >= 1", "len(range(1000000000000)) > 0"), 9, "range of 1,000,000,000,000 values"),
    (("rank >= 1", "all(all(x + y > 0 for y in range(4096)) for x in range(4096))"), 9, "budget is 20,000"),
    (("    args: {self: tensor}", "    args: {" + ", ".join(f"a{i}: int" for i in range(70)) + "}"), 7, "at most 64"),
])
def test_out_of_range_values_are_located(edit, line, words):
    text = PACK.replace(*edit)
    assert text != PACK
    errs = errors(text)
    assert any(d.line == line and words in d.message for d in errs), errs


def test_guard_budget_error_points_into_the_guard():
    text = PACK.replace("rank >= 1", "rank >= 1 and all(all(x + y > 0 for y in range(4096)) for x in range(4096))")
    (d,) = errors(text)
    assert (d.line, d.column) == (9, 33) and "budget" in d.message  # column of the inner all(
