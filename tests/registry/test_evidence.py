"""Evidence rows (revision 0003): append-only, superseded by newer runs, stale when the chip
or its rule packs move on; on SQLite and a real PostgreSQL server."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from tests.registry.registry_gen import hcd_text, pack_text

from torchfl.registry.evidence import claim_state, describe


def _row(op="aten.add.Tensor", dtype="float16", layout="contiguous", verdict="pass", **kw):
    base = dict(op=op, dtype=dtype, layout=layout, verdict=verdict, samples=4, passed=4, failed=0, refused=0,
                max_abs_error=1e-4, max_rel_error=2e-4, reason=None, first_failure=None)
    base.update(kw)
    return base


def _record(reg, chip, results):
    ident = reg.identity(chip)
    return reg.record_conformance(ident, harness_hash="h" * 64, started_at=datetime.now(timezone.utc),
                                  settings={"samples": 4}, results=results)


@pytest.fixture
def chip_reg(reg, tmp_path):
    reg.import_texts([("a.hcd", hcd_text("A-1"))])
    pack = tmp_path / "mini.yaml"
    pack.write_text(pack_text())
    reg.import_files([pack])
    return reg


def test_recorded_verdicts_read_back_with_their_run(chip_reg):
    fail = _row(verdict="partial", layout="strided", passed=3, failed=1, first_failure={"inputs": ["f16[2, 3]"]})
    run = _record(chip_reg, "A-1", [_row(), fail])
    rows = chip_reg.evidence(chip="A-1")
    assert [(e.run_id, e.op, e.layout, e.verdict) for e in rows] == [
        (run, "aten.add.Tensor", "contiguous", "pass"), (run, "aten.add.Tensor", "strided", "partial")]
    assert rows[1].first_failure == {"inputs": ["f16[2, 3]"]}
    ident = chip_reg.identity("A-1")
    assert rows[0].identity == ident and not rows[0].stale
    assert claim_state(rows) == "partial"
    assert describe(rows)["problems"][0]["layout"] == "strided"
    (summary,) = chip_reg.conformance_runs(chip="A-1")
    assert summary["run"] == run and summary["verdicts"] == {"pass": 1, "partial": 1, "fail": 0, "refused": 0}


def test_a_newer_run_supersedes_per_key_and_keeps_the_rest(chip_reg):
    _record(chip_reg, "A-1", [_row(verdict="fail", passed=0, failed=4), _row(op="aten.relu.default")])
    second = _record(chip_reg, "A-1", [_row()])
    rows = {e.op: e for e in chip_reg.evidence(chip="A-1")}
    assert rows["aten.add.Tensor"].verdict == "pass" and rows["aten.add.Tensor"].run_id == second
    assert rows["aten.relu.default"].run_id == second - 1   # not covered by the newer run: kept
    assert len(chip_reg.conformance_runs()) == 2


def test_evidence_of_an_older_chip_or_pack_version_is_stale(chip_reg, tmp_path):
    _record(chip_reg, "A-1", [_row()])
    chip_reg.import_texts([("a2.hcd", hcd_text("A-1", "1.1.0", cache_kb=2048))])
    (e,) = chip_reg.evidence(chip="A-1")
    assert e.stale == ("chip A-1 was 1.0.0, now 1.1.0",) and claim_state([e]) == "stale"
    _record(chip_reg, "A-1", [_row()])
    assert not chip_reg.evidence(chip="A-1")[0].stale
    newer = tmp_path / "mini2.yaml"
    newer.write_text(pack_text("1.0.1"))
    chip_reg.import_files([newer])
    (e,) = chip_reg.evidence(chip="A-1")
    assert e.stale and "rule pack" in e.stale[0] and "now 1.0.1" in e.stale[0]


def test_a_bad_row_writes_nothing(chip_reg):
    with pytest.raises(ValueError, match="verdict 'maybe'"):
        _record(chip_reg, "A-1", [_row(), _row(op="aten.relu.default", verdict="maybe")])
    assert chip_reg.conformance_runs() == [] and chip_reg.evidence() == []


def test_duplicate_keys_in_one_run_roll_the_run_back(chip_reg):
    from torchfl.registry import RegistryError

    with pytest.raises(RegistryError):
        _record(chip_reg, "A-1", [_row(), _row()])
    assert chip_reg.conformance_runs() == []


def test_route_counts_per_model_run(chip_reg):
    ident = chip_reg.identity("A-1")
    chip_reg.record_routes(ident, model="resnet18", precision="float16",
                           routes={"aten::convolution": {"conv2d_bn_relu": 8, "conv2d": 1},
                                   "aten::_to_copy": {"CPU (torch)": 2}})
    chip_reg.record_routes(ident, model="gpt2", precision=None, routes={"aten::embedding": {"embedding": 2}})
    runs = chip_reg.routes("A-1")
    assert [r["model"] for r in runs] == ["gpt2", "resnet18"]
    assert runs[1]["routes"]["aten::convolution"] == {"conv2d": 1, "conv2d_bn_relu": 8}
    assert [r["model"] for r in chip_reg.routes("A-1", model="resnet18")] == ["resnet18"]


@pytest.mark.parametrize("table", ["conformance_runs", "conformance_results", "route_runs", "route_counts"])
@pytest.mark.parametrize("statement", ["UPDATE {t} SET id = id", "DELETE FROM {t}"])
def test_evidence_rows_cannot_be_edited_even_by_sql(chip_reg, registry_url, table, statement):
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from torchfl.registry.engine import create_registry_engine

    _record(chip_reg, "A-1", [_row()])
    chip_reg.record_routes(chip_reg.identity("A-1"), model="m", precision=None, routes={"aten::add": {"add": 1}})
    engine = create_registry_engine(registry_url)
    with pytest.raises(DBAPIError, match="immutable"):
        with engine.begin() as conn:
            conn.execute(text(statement.format(t=table)))
    engine.dispose()
    assert len(chip_reg.evidence()) == 1 and len(chip_reg.routes("A-1")) == 1


def test_the_default_registry_migrates_itself_to_the_evidence_schema(tmp_path, monkeypatch):
    """A user's default registry made by an older torchfl (revision 0002) gains the evidence
    tables on first use; a registry named by URL still asks for `registry upgrade`."""
    from torchfl.registry import Registry, migrate
    from torchfl.registry.engine import WRITE, create_registry_engine
    from torchfl.registry.names import HEAD

    monkeypatch.delenv("TORCHFL_REGISTRY_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    with Registry() as first:
        assert first.is_default and first.chips()
        url = first.url
    engine = create_registry_engine(url)
    with engine.connect() as conn:
        conn = conn.execution_options(**WRITE)
        with conn.begin():
            migrate.downgrade(conn, "0002")
    engine.dispose()
    with Registry() as again:
        assert again.schema_revision() == "0002"
        assert [c.name for c in again.chips()] and again.schema_revision() == HEAD
        assert again.evidence() == []


def test_registry_routes_cli_shows_recorded_runs(chip_reg, cli):
    ident = chip_reg.identity("A-1")
    chip_reg.record_routes(ident, model="resnet18", precision="float16",
                           routes={"aten.convolution.default": {"conv2d_bn_relu": 8},
                                   "aten._to_copy.default": {"CPU fallback": 2}})
    out = cli("routes", "--chip", "A-1")
    assert out.exit_code == 0, out.output
    assert "resnet18 on A-1 1.0.0 (float16): 8 kernel, 0 fold, 2 fallback" in out.output
    assert "2 x CPU fallback" in out.output
    data = json.loads(cli("routes", "--chip", "A-1", "--json").output)
    assert data[0]["routes"]["aten.convolution.default"] == {"conv2d_bn_relu": 8}
    assert cli("routes", "--chip", "Nope").exit_code == 1
