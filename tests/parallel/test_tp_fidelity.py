"""The tensor-parallel fidelity tables load, and a ``tp`` row is priced as a shard plus its collectives."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchfl.fidelity.run import score_tables
from torchfl.fidelity.tables import load_table, parse_table
from torchfl.planner.whatif import chip_of
from torchfl.resources import bundled_path

TABLES = sorted(Path(bundled_path("measurements")).glob("lm_*_tp*.csv"))


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_the_tp_tables_load_and_state_source_licence_harness(path):
    t = load_table(path)
    text = "\n".join(t.comments)
    assert "https://" in text or "github.com" in text
    assert "Licence" in text and "Harness" in text and "Submission:" in text and "Out of sample" in text
    assert t.rows and all(isinstance(r.args.get("tp"), int) and r.args["tp"] > 1 for r in t.rows)


def test_there_are_tp_2_4_8_rows_on_a100_and_h100():
    rows = [r for p in TABLES for r in load_table(p).rows]
    assert {r.args["tp"] for r in rows} == {2, 4, 8}
    assert {r.chip for r in rows} == {"A100-SXM4-80GB", "H100-SXM5-80GB"}


def _table(tp):
    return parse_table('chip,op,shapes,dtype,args,seconds,source\n'
                       f'A100-SXM4-80GB,decode,1x64,float32,"{{""model"": ""tiny-llama"", ""tp"": {tp}}}",0.001,x\n',
                       "t.csv")


def test_a_tp_row_adds_the_collectives_to_the_shard():
    a100 = chip_of("A100-SXM4-80GB")
    [one] = score_tables([_table(1)], lambda name: a100).predictions
    [two] = score_tables([_table(2)], lambda name: a100).predictions
    assert one.predicted_s and two.predicted_s
    assert any("tensor parallel 2" in n for n in two.notes) and not any("tensor parallel" in n for n in one.notes)


def test_a_bad_tp_is_refused_with_the_fix():
    a100 = chip_of("A100-SXM4-80GB")
    [p] = score_tables([_table(0)], lambda name: a100).predictions
    assert p.predicted_s is None and "tp is the measurement's tensor-parallel degree" in p.reason
