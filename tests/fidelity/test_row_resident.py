"""HCD 1.1 ``execution.row_resident_elements``: the longest row a row-wise reduction (softmax,
layer norm) keeps on one core across its passes. A longer row is read once per pass (statistics,
then normalise), whatever the size of the chip's shared cache. The field validates and shows,
the two tilers honour it, the kernels execute exactly the plan it gives (counted == predicted,
results against torch), and on the published softmax tables of the A100 and the MI210 (held out:
the number comes from PyTorch's source, not from these rows) it lowers the mean error below both
the score without it and the issue's goal."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner

from torchfl.hcd import check_hcd_text, load_hcd, load_hcd_text
from torchfl.kernels.catalog import CATALOG
from torchfl.kernels.chip import ChipModel
from torchfl.resources import bundled_path

REG = bundled_path("hcd_registry")
A100 = (REG / "a100_sxm4_80gb.hcd").read_text()
SEED = (REG / "npu_v3.hcd").read_text()
LINE = re.compile(r"^  row_resident_elements:.*\n", re.M)
SOURCE_LINE = re.compile(r"^  execution\.row_resident_elements:.*\n", re.M)     # its format-1.2 provenance


def without_field(text: str) -> str:
    """The same chip without the per-core row (what predicted before the field existed)."""
    assert LINE.search(text), "the bundled chip states row_resident_elements"
    return SOURCE_LINE.sub("", LINE.sub("", text))


def errors(text):
    return [d for d in check_hcd_text(text, "chip.hcd").diagnostics if d.severity == "error"]


# -- the field ----------------------------------------------------------------------------------

def test_the_field_loads_reaches_the_chip_model_and_is_optional():
    hcd = load_hcd_text(SEED + "execution:\n  row_resident_elements: 1024\n")
    assert hcd.format_version == "1.1" and hcd.execution.row_resident_elements == 1024
    assert ChipModel.from_hcd(hcd).row_elements == 1024
    assert ChipModel.from_hcd(load_hcd_text(SEED)).row_elements == 0          # 1.0: no per-core limit
    assert ChipModel.from_hcd(load_hcd(REG / "a100_sxm4_80gb.hcd")).row_elements == 1024
    with pytest.raises(ValueError, match="row_elements must be >= 0"):
        ChipModel(row_elements=-1)


@pytest.mark.parametrize("value, words", [("0", "must be >= 1"), ("1.5", "integer"), ('"long"', "integer")])
def test_a_bad_value_is_located(value, words):
    text = SEED + f"execution:\n  row_resident_elements: {value}\n"
    (d,) = errors(text)
    assert d.path == "execution.row_resident_elements" and words in d.message, str(d)
    assert d.line == text.count("\n") and d.column == 26, str(d)


def test_schema_show_and_diff_say_what_it_counts(tmp_path):
    from torchfl.cli.main import cli
    from torchfl.hcd.schema import hcd_json_schema
    from torchfl.registry.diff import diff

    desc = hcd_json_schema()["$defs"]["Execution"]["properties"]["row_resident_elements"]["description"]
    assert "elements" in desc and "once per pass" in desc
    text = SEED + "execution:\n  row_resident_elements: 1024\n"
    path = tmp_path / "chip.hcd"
    path.write_text(text)
    out = CliRunner().invoke(cli, ["hcd", "show", str(path)], env={"COLUMNS": "220"})
    assert out.exit_code == 0 and "rows of up to 1024 elements kept on one core" in out.output, out.output
    js = json.loads(CliRunner().invoke(cli, ["hcd", "show", str(path), "--json"]).output)
    assert js["execution"]["row_resident_elements"] == 1024
    changes = [str(c) for c in diff(load_hcd_text(SEED).canonical(), load_hcd_text(text).canonical())]
    assert "+ execution.row_resident_elements: 1024 (elements)" in changes


# -- the tilers ---------------------------------------------------------------------------------

A100_CHIP = ChipModel.from_hcd(load_hcd(REG / "a100_sxm4_80gb.hcd"))
NO_LIMIT = replace(A100_CHIP, row_elements=0)


def tile(kernel, shape, chip, dtype="float16"):
    spec = CATALOG[kernel]
    attrs = {"dim": -1} if "softmax" in kernel else {"normalized_shape": (shape[-1],)}
    return spec.tile(spec.problem({"x": shape}, attrs, dtype), chip)


@pytest.mark.parametrize("kernel, multi", [("softmax", "row_split"), ("log_softmax", "row_split"),
                                           ("layer_norm", "chunked")])
def test_a_row_longer_than_one_core_keeps_is_read_once_per_pass(kernel, multi):
    M, N = 4096, 2048           # 16 MiB in + out: fits the A100's 40 MB L2, not one SM
    before, after = tile(kernel, (M, N), NO_LIMIT), tile(kernel, (M, N), A100_CHIP)
    assert before.config.strategy in ("resident", "streamed")
    assert before.traffic.bytes_read == M * N * 2
    assert after.config.strategy == multi and "row_resident_elements" in after.config.notes
    assert after.traffic.bytes_read == 2 * M * N * 2                         # statistics pass + normalise pass
    assert after.traffic.bytes_written == before.traffic.bytes_written
    chunk = after.config.tile("chunk") or after.config.tile("elements")
    assert chunk <= 1024
    from torchfl.kernels.tiling import simulated_time

    assert simulated_time(after, A100_CHIP, "float16") > 1.4 * (simulated_time(before, NO_LIMIT, "float16")
                                                                 - A100_CHIP.launch_s)


@pytest.mark.parametrize("kernel", ["softmax", "layer_norm"])
@pytest.mark.parametrize("N", [32, 1000, 1024])
def test_rows_within_the_limit_are_planned_as_before(kernel, N):
    assert tile(kernel, (4096, N), A100_CHIP) == tile(kernel, (4096, N), NO_LIMIT)


def test_the_backward_kernels_without_a_chunked_form_are_untouched():
    spec = CATALOG["layer_norm_backward"]
    shapes = {"grad_out": (64, 4096), "x": (64, 4096), "mean": (64, 1), "rstd": (64, 1)}
    prob = spec.problem(shapes, {"normalized_shape": (4096,)}, "float16",
                        dtypes={"mean": "float32", "rstd": "float32"})
    assert spec.tile(prob, A100_CHIP) == spec.tile(prob, NO_LIMIT)


# -- execution: the plan the field gives is what the kernels run --------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kernel", ["softmax", "log_softmax", "layer_norm"])
def test_the_kernels_run_the_per_core_plan_and_match_torch(kernel, dtype):
    import torch

    from tests.kernels.helpers import as_f32, assert_close, dev, run_checked
    from torchfl.kernels import DeviceMemory

    chip = ChipModel(row_elements=64)           # a big cache, but 64 elements per core
    mem = DeviceMemory(chip)
    x = dev(torch.randn(5, 200) * 3, mem, dtype)
    attrs = {"dim": -1} if "softmax" in kernel else {"normalized_shape": (200,)}
    outs, plan = run_checked(kernel, chip, {"x": x}, attrs)     # asserts counted == predicted
    assert plan.config.strategy in ("row_split", "chunked")
    assert plan.traffic.bytes_read == 2 * 5 * 200 * (4 if dtype == "float32" else 2)
    if kernel == "layer_norm":
        ref = torch.nn.functional.layer_norm(as_f32(x), (200,))
    else:
        ref = getattr(torch, kernel)(as_f32(x), -1)
    assert_close(as_f32(outs[0]), ref, dtype, what=f"{kernel} {plan.config.strategy}")


# -- the published tables (out of sample: the 1024 is read from PyTorch's source) ---------------

def _scores(table: str, chip_file: str):
    from torchfl.fidelity.oneop import predict
    from torchfl.fidelity.tables import load_table
    from torchfl.planner.target import Target, bundled_packs

    packs = bundled_packs()
    text = (REG / chip_file).read_text()
    rows = load_table(bundled_path("measurements") / table).rows
    out = {}
    for label, hcd_text in (("with", text), ("without", without_field(text))):
        target = Target.of(load_hcd_text(hcd_text), packs)
        out[label] = [predict(r, target) for r in rows]
    return rows, out


@pytest.mark.parametrize("table, chip_file", [("llmcompass_softmax_a100.csv", "a100_sxm4_80gb.hcd"),
                                              ("llmcompass_softmax_mi210.csv", "mi210.hcd")])
def test_published_softmax_tables_score_better_with_the_per_core_row(table, chip_file):
    rows, preds = _scores(table, chip_file)
    mean = {k: sum(abs(p.error) for p in v) / len(v) for k, v in preds.items()}
    # the bound is the same table scored without the field, and the goal (15%) on the A100.
    # The MI210's off-chip share is a class default since issue 47 (0.86; it was 0.3795, fitted to an
    # LLMCompass GELU row): its PyTorch 2.0 kernels streamed at ~38% of HBM, so this table now misses
    # by ~40% out of sample (BENCHMARKS.md "Out of sample (issue 47)"); the field still helps it.
    assert mean["with"] < mean["without"] and (mean["with"] <= 0.15 or "mi210" in table), mean
    for r, new, old in zip(rows, preds["with"], preds["without"]):
        N = r.shapes[0][-1]
        if N <= 1024:       # one pass as before: the same price
            assert new.predicted_s == old.predicted_s, r.label()
        else:               # the class that was mispriced: dearer, and nearer the measurement
            assert new.predicted_s > old.predicted_s, r.label()
            assert old.error < 0 and abs(new.error) < abs(old.error), r.label()


# -- fewer rows than cores: the idle cores pull nothing -----------------------------------------

@pytest.mark.parametrize("kernel", ["softmax", "layer_norm"])
def test_fewer_rows_than_cores_stream_a_share_of_the_bandwidth(kernel):
    from torchfl.kernels.tiling import time_terms

    cores = A100_CHIP.concurrent_tiles
    assert cores == 108
    few, full = tile(kernel, (32, 4096), A100_CHIP), tile(kernel, (256, 4096), A100_CHIP)
    assert few.config.parallel_units == 32 and full.config.parallel_units == 256
    t_few, t_full = time_terms(few, A100_CHIP, "float16"), time_terms(full, A100_CHIP, "float16")
    assert t_few.busy_cores == 32 and t_full.busy_cores == 0
    assert any("32 busy cores" in n for n in t_few.notes())
    # the memory term of 32 rows is that of 32 rows at 32/108 of the bandwidth: as dear as 108 rows
    assert t_few.memory_s == pytest.approx(t_full.memory_s * 32 / 256 * cores / 32)
    # a chip without a parallel grain (format 1.0) states no units and prices as before
    plain = tile(kernel, (32, 4096), ChipModel())
    assert plain.config.parallel_units == 0 and "parallel_units" not in plain.config.as_dict()
