"""One per-call figure and one run-once figure wherever a time is shown (issue 36): explain's
text and JSON summary, `plan compare`, `plan impact` and `plan report` give the same two
numbers under the same two names ("per call", "run once"); the rejected alternatives use the
table's units. Before: compare said 2.36 ms for ResNet-50 on NPU-V3 where explain said "per
call 1.16 ms" and "run once 1.2 ms" (compare added both)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchfl.planner.texttable import human_time

ROOT = Path(__file__).resolve().parents[2]
MODEL = ["mlp", "--precision", "float16"]         # float32 parameters cast once: a run-once part


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    base = tmp_path_factory.mktemp("percall")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_") and k != "COLUMNS"}
    env.update(XDG_DATA_HOME=str(base / "data"), PYTHONPATH=str(ROOT))

    def run(*args, status=0):
        res = subprocess.run([sys.executable, "-m", "torchfl.cli", *args], cwd=base, env=env, capture_output=True,
                             text=True, timeout=600)
        assert res.returncode == status, res.stderr[-2000:]
        return res.stdout

    run.base = base
    return run


@pytest.fixture(scope="module")
def summary(cli):
    return json.loads(cli("plan", "explain", *MODEL, "--chip", "NPU-V3", "--format", "json"))["summary"]


def test_summary_splits_per_call_and_run_once(summary):
    assert summary["run_once_time_s"] > 0 and summary["per_call_time_s"] > 0
    assert summary["per_call_time_s"] + summary["run_once_time_s"] == pytest.approx(summary["predicted_time_s"])
    assert summary["per_call_bytes"] + summary["run_once_bytes"] == pytest.approx(summary["predicted_bytes"])


def test_explain_text_shows_the_same_two_figures(cli, summary):
    text = " ".join(cli("plan", "explain", *MODEL, "--chip", "NPU-V3").split())
    assert f"Per call: predicted {human_time(summary['per_call_time_s'])}," in text
    assert f"on the chip): {human_time(summary['run_once_time_s'])}," in text
    # rejected alternatives in the table's units, not 8.97e-07 s
    assert not re.search(r"\d(\.\d+)?e-\d+ s\b", text), re.search(r".{60}\d(\.\d+)?e-\d+ s\b.{20}", text)


def test_compare_uses_the_per_call_and_run_once_of_explain(cli, summary):
    data = json.loads(cli("plan", "compare", *MODEL, "--chips", "NPU-V3", "--json"))
    (row,) = data["rows"]
    assert row["per_call_time_s"] == pytest.approx(summary["per_call_time_s"])
    assert row["run_once_time_s"] == pytest.approx(summary["run_once_time_s"])
    assert "predicted_time_s" not in row
    text = cli("plan", "compare", *MODEL, "--chips", "NPU-V3")
    head = " ".join(text.splitlines()[1:3])
    assert "per" in head and "run" in head and "conversions" in head and " conv " not in f" {head} "
    flat = " ".join(text.split())
    assert human_time(summary["per_call_time_s"]) in flat and human_time(summary["run_once_time_s"]) in flat


def test_report_header_says_per_call_and_run_once(cli, summary):
    pytest.importorskip("matplotlib")
    cli("plan", "report", *MODEL, "--chip", "NPU-V3", "-o", "r.html")
    page = (cli.base / "r.html").read_text()
    assert f"per call {human_time(summary['per_call_time_s'])}" in page
    assert f"run once {human_time(summary['run_once_time_s'])}" in page
