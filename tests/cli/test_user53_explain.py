"""Issue 53 point 7 (and 12's help): `plan explain bert-base` printed 2,436 lines; `--top N`
prints the summary first and the N slowest per-call steps only, within 100 columns in a pipe.
`plan explain --help` names the causal LMs it takes (llama-7b, llama-70b, tiny-llama)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli

TIME = re.compile(r"([\d.]+) (ns|us|ms|s)\s+[\d.]+%$")      # a row's time, before its share
ROOT = Path(__file__).resolve().parents[2]
SCALE = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def test_explain_help_names_the_language_models():
    res = CliRunner().invoke(cli, ["plan", "explain", "--help"])
    text = " ".join(res.output.split())
    for name in ("llama-7b", "llama-70b", "tiny-llama", "--top"):
        assert name in text, name


@pytest.mark.slow
def test_top_shows_the_summary_then_the_slowest_steps_of_bert_base(tmp_path):
    pytest.importorskip("transformers")
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    assert CliRunner().invoke(cli, ["registry", "init", "--registry", url]).exit_code == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_")}
    env["PYTHONPATH"] = str(ROOT)
    res = subprocess.run([sys.executable, "-m", "torchfl.cli", "plan", "explain", "bert-base", "--chip",
                          "H100-SXM5-80GB", "--top", "5", "--registry", url], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert res.returncode == 0, res.stdout
    lines = res.stdout.splitlines()          # stdout and stderr together, as a terminal shows them
    assert len(lines) < 60, len(lines)                    # the whole plan: thousands of lines
    assert all(len(x) <= 100 for x in lines), max(lines, key=len)
    assert lines[0].startswith("412 of 413 nodes on H100-SXM5-80GB") or " nodes on H100-SXM5-80GB" in lines[0]
    text = "\n".join(lines)
    head = text.index("The 5 slowest of")
    for summary in ("Per call: predicted", "Device memory: peak", "Per-call time by kernel:"):
        assert text.index(summary) < head, summary          # the summary first
    rows = [x for x in lines[lines.index(next(x for x in lines if x.startswith("---"))) + 1:]
            if re.match(r"^\s*\d+\s{2}", x)]
    assert len(rows) == 5, rows
    times = [float(m.group(1)) * SCALE[m.group(2)] for m in (TIME.search(r) for r in rows) if m]
    assert times == sorted(times, reverse=True) and len(times) == 5, rows
    assert "more steps (without --top" in text


def test_top_refuses_json_and_analyze():
    res = CliRunner().invoke(cli, ["plan", "explain", "mlp", "--chip", "NPU-V3", "--top", "3", "--format", "json"])
    assert res.exit_code == 1 and "--top shortens the text plan" in res.output


@pytest.mark.slow
def test_a_long_plan_ends_with_the_hint_to_top(tmp_path):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    assert CliRunner().invoke(cli, ["registry", "init", "--registry", url]).exit_code == 0
    res = CliRunner().invoke(cli, ["plan", "explain", "resnet50", "--chip", "NPU-V3", "--registry", url])
    assert res.exit_code == 0, res.output
    last = res.output.splitlines()[-1]
    assert last.startswith("(") and "steps: `--top 20` shows the summary first" in last, last
    short = CliRunner().invoke(cli, ["plan", "explain", "mlp", "--chip", "NPU-V3", "--registry", url])
    assert "--top 20" not in short.output                      # 14 steps: no hint
