"""One broken fixture per validation rule, asserting the exact line:column and path reported.

Fixtures are the BASE document below with one line replaced, inserted or deleted, so the
expected position can be read off this file (line numbers are 1-based, as reported).
"""

from __future__ import annotations

import textwrap

import pytest

from torchfl.hcd import check_hcd_text

BASE = textwrap.dedent("""\
    chip:
      name: TEST-1
      vendor: tests
      version: 1.0.0
      device_type: test_1
    compute_units:
      fp16:
        count: 64
        peak_tflops: 10.0
        supported_layouts: [NCHW, NHWC]
      int8:
        count: 128
        peak_tops: 20.0
      attention:
        enabled: true
        max_sequence_length: 2048
        supported_heads: [1, 2, 4, 8]
    memory:
      on_chip_cache:
        size_kb: 4096
        bandwidth_gb_per_s: 128
      off_chip_memory:
        bandwidth_gb_per_s: 64
    tensor:
      max_rank: 5
      supported_dtypes: [torch.float16, torch.int8]
      default_layout: NHWC
    constraints:
      max_batch_size: 256
      max_sequence_length: 4096
      memory_alignment_bytes: 128
    """)


def edit(replace: dict[int, str] | None = None, delete: tuple[int, ...] = (), insert: dict[int, str] | None = None) -> str:
    """BASE with 1-based lines replaced, deleted, or new lines inserted after a line."""
    lines = BASE.splitlines()
    out = []
    for n, line in enumerate(lines, start=1):
        if n in delete:
            continue
        out.append((replace or {}).get(n, line))
        if insert and n in insert:
            out.extend(insert[n].splitlines())
    return "\n".join(out) + "\n"


def diags(text: str, severity: str = "error"):
    report = check_hcd_text(text, "t.hcd")
    return [(d.line, d.column, d.path, d.message) for d in report.diagnostics if d.severity == severity]


def one(text: str, severity: str = "error"):
    found = diags(text, severity)
    assert len(found) == 1, found
    return found[0]


def test_base_is_valid_without_warnings():
    report = check_hcd_text(BASE, "t.hcd")
    assert report.ok and report.diagnostics == []
    assert report.hcd.chip.name == "TEST-1"


# ---------------------------------------------------------------- completeness and types

def test_missing_required_field_reported_at_parent_key():
    line, col, path, msg = one(edit(delete=(20,)))  # size_kb
    assert (line, col, path) == (19, 3, "memory.on_chip_cache.size_kb")
    assert "required field 'size_kb' is missing" in msg and "KiB" in msg


def test_missing_section():
    text = edit(delete=tuple(range(28, 32)))  # constraints section
    line, col, path, msg = one(text)
    assert (line, col, path) == (1, 1, "constraints")
    assert "required field 'constraints'" in msg


def test_wrong_type_integer():
    line, col, path, msg = one(edit({8: "    count: many"}))
    assert (line, col, path) == (8, 12, "compute_units.fp16.count")
    assert "expected an integer, got 'many'" in msg


def test_float_where_integer_expected():
    line, col, path, msg = one(edit({29: "  max_batch_size: 12.5"}))
    assert (line, col, path) == (29, 19, "constraints.max_batch_size")
    assert "integer" in msg


def test_bool_is_not_an_integer():
    line, col, path, _ = one(edit({25: "  max_rank: true"}))
    assert (line, col, path) == (25, 13, "tensor.max_rank")


def test_unquoted_version_number():
    line, col, path, msg = one(edit({4: "  version: 1.0"}))
    assert (line, col, path) == (4, 12, "chip.version")
    assert 'quote it' in msg


def test_version_not_semver():
    line, col, path, msg = one(edit({4: "  version: v1"}))
    assert (line, col, path) == (4, 12, "chip.version")
    assert "semantic version" in msg


def test_unknown_field_with_did_you_mean():
    # the typo is unknown AND size_kb is then missing: two errors, both located
    found = diags(edit({20: "    size_kbb: 4096"}))
    assert (20, 5, "memory.on_chip_cache.size_kbb") in [(a, b, c) for a, b, c, _ in found]
    unknown = next(m for a, b, c, m in found if c.endswith("size_kbb"))
    assert "did you mean 'size_kb'?" in unknown


def test_unknown_top_level_section():
    found = diags(edit(insert={31: "extras:\n  colour: blue"}))
    assert found[0][:3] == (32, 1, "extras")
    assert "unknown field 'extras'" in found[0][3]


def test_wrong_rate_key_for_unit_kind():
    found = diags(edit({13: "    peak_tflops: 20.0"}))
    unknown = [f for f in found if f[2] == "compute_units.int8.peak_tflops"]
    assert unknown and unknown[0][:2] == (13, 5)
    assert "peak_tops" in unknown[0][3]


def test_device_type_syntax():
    line, col, path, msg = one(edit({5: "  device_type: NPU V3"}))
    assert (line, col, path) == (5, 16, "chip.device_type")
    assert "lower-case" in msg


def test_unknown_dtype():
    line, col, path, msg = one(edit({26: "  supported_dtypes: [torch.float16, torch.int8, torch.float64]"}))
    assert (line, col, path) == (26, 49, "tensor.supported_dtypes[2]")
    assert "torch.float64" in msg


# ---------------------------------------------------------------- numeric sanity

def test_count_must_be_positive():
    line, col, path, msg = one(edit({8: "    count: 0"}))
    assert (line, col, path) == (8, 12, "compute_units.fp16.count")
    assert "must be > 0" in msg


def test_negative_rate():
    line, col, path, msg = one(edit({9: "    peak_tflops: -1"}))
    assert (line, col, path) == (9, 18, "compute_units.fp16.peak_tflops")
    assert "must be >= 1e-06 to be plausible" in msg


def test_implausible_rate():
    line, col, path, msg = one(edit({9: "    peak_tflops: 5000000"}))
    assert (line, col, path) == (9, 18, "compute_units.fp16.peak_tflops")
    assert "plausible" in msg


def test_alignment_power_of_two():
    line, col, path, msg = one(edit({31: "  memory_alignment_bytes: 96"}))
    assert (line, col, path) == (31, 27, "constraints.memory_alignment_bytes")
    assert "power of two" in msg


def test_max_rank_range():
    line, col, path, _ = one(edit({25: "  max_rank: 0"}))
    assert (line, col, path) == (25, 13, "tensor.max_rank")


# ---------------------------------------------------------------- layouts

def test_layout_with_repeated_letter():
    line, col, path, msg = one(edit({10: "    supported_layouts: [NCHW, NHHW]"}))
    assert (line, col, path) == (10, 31, "compute_units.fp16.supported_layouts[1]")
    assert "permutation of distinct" in msg


def test_layout_lowercase():
    line, col, path, _ = one(edit({10: "    supported_layouts: [nchw, NHWC]"}))
    assert (line, col, path) == (10, 25, "compute_units.fp16.supported_layouts[0]")


def test_unusual_layouts_are_accepted():
    report = check_hcd_text(edit({10: "    supported_layouts: [NCHW, NHWC, NCWH, WHCN]"}), "t.hcd")
    assert report.ok, report.diagnostics


def test_default_layout_not_supported():
    line, col, path, msg = one(edit({27: "  default_layout: NHCW"}))
    assert (line, col, path) == (27, 19, "tensor.default_layout")
    assert "not among the supported layouts [NCHW, NHWC]" in msg


def test_layout_rank_above_max_rank():
    found = diags(edit({25: "  max_rank: 3"}))
    assert (10, 25, "compute_units.fp16.supported_layouts[0]") in [f[:3] for f in found]
    assert any("above tensor.max_rank 3" in f[3] for f in found)


def test_layout_over_other_letters():
    line, col, path, msg = one(edit({10: "    supported_layouts: [NCHW, NHWC, ABCD]"}))
    assert (line, col, path) == (10, 37, "compute_units.fp16.supported_layouts[2]")
    assert "other dimension letters" in msg


def test_duplicate_layout():
    line, col, path, msg = one(edit({10: "    supported_layouts: [NCHW, NHWC, NCHW]"}))
    assert (line, col, path) == (10, 37, "compute_units.fp16.supported_layouts[2]")
    assert "listed twice" in msg


# ---------------------------------------------------------------- dtypes and units

def test_dtype_without_unit():
    line, col, path, msg = one(edit({26: "  supported_dtypes: [torch.float16, torch.int8, torch.float32]"}))
    assert (line, col, path) == (26, 49, "tensor.supported_dtypes[2]")
    assert "no compute unit runs it" in msg and "compute_units.fp32" in msg


def test_bfloat16_on_fp16_unit_is_a_warning():
    text = edit({26: "  supported_dtypes: [torch.float16, torch.int8, torch.bfloat16]"})
    assert diags(text) == []
    line, col, path, msg = one(text, "warning")
    assert (line, col, path) == (26, 49, "tensor.supported_dtypes[2]")
    assert "fp16 unit at its peak" in msg
    report = check_hcd_text(text, "t.hcd")
    assert report.hcd.unit_for("bfloat16") == "fp16"
    assert report.hcd.peak_ops_per_s("bfloat16") == 10.0e12


def test_native_bfloat16_contradicts_emulation():
    text = edit({26: "  supported_dtypes: [torch.float16, torch.int8, torch.bfloat16]"},
                insert={31: "  bfloat16_emulation: true"})
    line, col, path, msg = one(text)
    assert (line, col, path) == (26, 49, "tensor.supported_dtypes[2]")
    assert "contradicts" in msg


def test_emulation_needs_float16():
    text = edit({26: "  supported_dtypes: [torch.int8]"}, insert={31: "  bfloat16_emulation: true"})
    found = diags(text)
    assert (32, 3, "constraints.bfloat16_emulation") in [f[:3] for f in found]


def test_emulation_with_bf16_unit_contradicts():
    text = edit(insert={13: "  bf16:\n    count: 4\n    peak_tflops: 1.0"}, replace=None)
    text = text.replace("  memory_alignment_bytes: 128", "  memory_alignment_bytes: 128\n  bfloat16_emulation: true")
    found = diags(text)
    assert (14, 3, "compute_units.bf16") in [f[:3] for f in found]


def test_no_compute_unit():
    text = edit(delete=tuple(range(7, 14)))
    found = diags(text)
    assert (6, 1, "compute_units") in [f[:3] for f in found]


def test_unit_without_its_dtype_warns():
    text = edit({26: "  supported_dtypes: [torch.float16]"})
    line, col, path, msg = one(text, "warning")
    assert (line, col, path) == (11, 3, "compute_units.int8")


def test_duplicate_dtype():
    line, col, path, msg = one(edit({26: "  supported_dtypes: [torch.float16, torch.int8, torch.int8]"}))
    assert (line, col, path) == (26, 49, "tensor.supported_dtypes[2]")
    assert "listed twice" in msg


# ---------------------------------------------------------------- attention

def test_attention_sequence_above_chip():
    line, col, path, msg = one(edit({16: "    max_sequence_length: 8192"}))
    assert (line, col, path) == (16, 26, "compute_units.attention.max_sequence_length")
    assert "exceeds the chip's constraints.max_sequence_length 4096" in msg


def test_heads_positive():
    line, col, path, msg = one(edit({17: "    supported_heads: [1, 2, -4, 8]"}))
    assert (line, col, path) == (17, 29, "compute_units.attention.supported_heads[2]")
    assert "must be >= 1" in msg


def test_heads_unique():
    line, col, path, msg = one(edit({17: "    supported_heads: [1, 2, 4, 4]"}))
    assert (line, col, path) == (17, 32, "compute_units.attention.supported_heads[3]")
    assert "listed twice" in msg


def test_enabled_attention_needs_limits():
    found = diags(edit(delete=(17,)))
    assert found[0][:3] == (14, 3, "compute_units.attention.supported_heads")


def test_disabled_attention_needs_nothing():
    text = edit({15: "    enabled: false"}, delete=(16, 17))
    assert diags(text) == []


# ---------------------------------------------------------------- legacy units

def test_legacy_keys_warn_and_normalise():
    text = edit({9: "    peak_gflops: 10.0", 13: "    peak_gops: 20.0"})
    assert diags(text) == []
    warnings = diags(text, "warning")
    assert [w[:3] for w in warnings] == [(9, 5, "compute_units.fp16.peak_gflops"),
                                         (13, 5, "compute_units.int8.peak_gops")]
    assert "TFLOPS" in warnings[0][3] and "TOPS" in warnings[1][3]
    report = check_hcd_text(text, "t.hcd")
    assert report.hcd.compute_units.fp16.peak_tflops == 10.0
    assert "peak_gflops" not in report.hcd.canonical_json()
    assert report.hcd.content_hash() == check_hcd_text(BASE, "t.hcd").hcd.content_hash()


def test_legacy_and_canonical_together():
    text = edit(insert={9: "    peak_gflops: 10.0"})
    line, col, path, msg = one(text)
    assert (line, col, path) == (10, 5, "compute_units.fp16.peak_gflops")
    assert "keep only peak_tflops" in msg


def test_legacy_value_errors_point_at_legacy_key():
    line, col, path, _ = one(edit({9: "    peak_gflops: -3"}))
    assert (line, col) == (9, 18)


# ---------------------------------------------------------------- everything at once

def test_all_problems_reported_at_once():
    text = edit({8: "    count: -1", 27: "  default_layout: NHCW", 31: "  memory_alignment_bytes: 100"})
    found = diags(text)
    assert [f[:2] for f in found] == [(8, 12), (27, 19), (31, 27)]
