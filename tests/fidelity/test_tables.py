"""Fidelity tables: the CSV format of docs/HELPERS.md, every problem located at file:line."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchfl.fidelity.tables import (ALIASES, TableError, bundled_tables, family_of, load_table, load_tables,
                                     make_row, parse_table)

HEADER = "chip,op,shapes,dtype,args,seconds,source\n"


def table(tmp_path, body, name="t.csv"):
    path = tmp_path / name
    path.write_text(body)
    return path


def test_a_table_with_comments_aliases_and_quoted_args_loads(tmp_path):
    t = load_table(table(tmp_path, "# measured on X (licence: CC-BY 4.0)\n#\n" + HEADER +
                         "A100-SXM4-80GB,matmul,8192x64;64x64,bfloat16,,2.96e-05,llmc\n"
                         "A100-SXM4-80GB,softmax,4096x32,torch.float16,,1.31e-05,llmc\n"
                         "A100-SXM4-80GB,gelu,1024,float16,\"{\"\"approximate\"\": \"\"tanh\"\"}\",4.8e-05,llmc\n"
                         "\n"
                         "A100-SXM4-80GB,aten.addmm.default,64;8x32;32x64,float16,\"{\"\"beta\"\": 0.5}\",1e-5,x\n"))
    assert t.comments[0].startswith("measured on X")
    mm, sm, gelu, addmm = t.rows
    assert (mm.op, mm.alias, mm.shapes, mm.dtype, mm.family) == ("aten.mm.default", "matmul", ((8192, 64), (64, 64)),
                                                                 "bfloat16", "matmul")
    assert sm.op == "aten._softmax.default" and sm.args == {"dim": -1, "half_to_float": False}
    assert sm.dtype == "float16" and sm.line == 5
    assert gelu.args == {"approximate": "tanh"} and gelu.shapes == ((1024,),)
    assert addmm.line == 8 and addmm.family == "matmul" and addmm.args == {"beta": 0.5}
    assert addmm.label() == 'aten.addmm.default 64;8x32;32x64 float16 {"beta": 0.5}'


def test_every_bad_field_is_reported_with_its_line(tmp_path):
    body = ("# c\n" + HEADER +
            "A,matmul,8192x64;64x64,float16,,2e-5,s\n"        # line 3: fine
            ",matmul,8x8;8x8,float16,,1e-5,s\n"               # 4: chip
            "A,mm,8x8,float16,,1e-5,s\n"                      # 5: op
            "A,matmul,8xy;8x8,float16,,1e-5,s\n"              # 6: shapes
            "A,matmul,8x8;8x8,float17,,1e-5,s\n"              # 7: dtype
            "A,softmax,8x8,float16,{dim: 1},1e-5,s\n"         # 8: args (not JSON)
            "A,softmax,8x8,float16,[1],1e-5,s\n"              # 9: args (not an object)
            "A,softmax,8x8,float16,,-1,s\n"                   # 10: seconds
            "A,softmax,8x8,float16,,1e-5,\n"                  # 11: source
            "A,softmax,8x8,float16,1e-5,s\n")                 # 12: field count
    with pytest.raises(TableError) as info:
        load_table(table(tmp_path, body))
    got = {p.split(":")[1]: p for p in info.value.problems}
    assert sorted(got, key=int) == [str(n) for n in range(4, 13)], info.value.problems
    assert "chip: empty" in got["4"]
    assert "'mm' is neither an ATen overload" in got["5"]
    assert "'8xy' is not a shape" in got["6"]
    assert "'float17' is not a dtype" in got["7"]
    assert "args: not JSON" in got["8"] and "an object" in got["9"]
    assert "seconds: '-1' is not a positive number" in got["10"]
    assert "source: empty" in got["11"]
    assert "6 fields, the header has 7" in got["12"]
    assert all(p.startswith(str(tmp_path / "t.csv") + ":") for p in info.value.problems)


@pytest.mark.parametrize("body, words", [
    ("", "no header row"),
    ("# only comments\n", "no header row"),
    ("chip,op,shapes,dtype,seconds,source\n", "missing args"),
    ("chip,op,shapes,dtype,args,seconds,source,extra\n", "unknown extra"),
    (HEADER, "a header but no rows"),
    ("# harness_overhead_us: lots\n" + HEADER, "harness_overhead_us: write a number"),
])
def test_table_level_problems(tmp_path, body, words):
    with pytest.raises(TableError, match=words):
        load_table(table(tmp_path, body))


def test_unreadable_files_are_one_line_errors(tmp_path):
    with pytest.raises(TableError, match="not a file"):
        load_table(tmp_path / "missing.csv")
    (tmp_path / "bin.csv").write_bytes(HEADER.encode() + b"\xff\xfe\n")
    with pytest.raises(TableError, match=r"bin.csv:2: not UTF-8"):
        load_table(tmp_path / "bin.csv")


def test_load_tables_reports_all_files_at_once(tmp_path):
    a = table(tmp_path, HEADER + "A,matmul,8x8;8x8,float16,,0,s\n", "a.csv")
    b = table(tmp_path, HEADER + "A,softmax,8x8,float16,,1e-5,\n", "b.csv")
    with pytest.raises(TableError) as info:
        load_tables([a, b])
    assert [p.split(":")[0].rsplit("/", 1)[-1] for p in info.value.problems] == ["a.csv", "b.csv"]


def test_directives_harness_and_calibration(tmp_path):
    t = parse_table("# harness_overhead_us: 33 torch.compile'd call\n# calibrates: X fp16 sustained\n" + HEADER +
                    "A,gelu,1024,float16,,4.8e-5,s\n", "g.csv")
    assert t.harness_s == pytest.approx(33e-6) and t.rows[0].harness_s == pytest.approx(33e-6)
    assert t.calibrates == ("X fp16 sustained",) and t.in_sample


def test_make_row_takes_typed_fields_for_tools():
    r = make_row("HOST", "layer_norm", [[32, 768], [768], [768]], "float32", {"eps": 1e-5}, 1e-5, "probe")
    assert r.shapes == ((32, 768), (768,), (768,)) and r.args == {"eps": 1e-5} and r.family == "layer_norm"
    with pytest.raises(TableError, match="seconds"):
        make_row("HOST", "gelu", [[4]], "float32", {}, float("nan"), "probe")


def test_families_and_aliases():
    assert family_of("aten.convolution.default") == "conv2d" and family_of("aten.relu.default") == "relu"
    assert set(ALIASES) >= {"matmul", "softmax", "layer_norm", "gelu", "conv2d", "bmm", "linear"}
    assert family_of("aten.bmm.default") == "matmul" and family_of("aten.linear.default") == "matmul"


def test_bundled_tables_load_and_name_their_source_and_licence():
    """LLMCompass's op tables; the language-model tables are tests/fidelity/test_lm_rows.py's, the issue-47
    evaluation tables (NeuSight, Liger) tests/fidelity/test_bundled_sources.py's."""
    tables = [t for t in load_tables(bundled_tables()) if Path(t.name).name.startswith("llmcompass_")]
    assert len(tables) >= 8
    for t in tables:
        text = "\n".join(t.comments)
        assert "LLMCompass" in text and "BSD 3-Clause" in text, t.path
        assert {r.chip for r in t.rows} <= {"A100-SXM4-80GB", "MI210"}
    assert sum(len(t.rows) for t in tables) == 170
