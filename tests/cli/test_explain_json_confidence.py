"""`plan explain --format json` carries the confidence its text shows (issue 47 item 5:
"confidence everywhere a time is shown ... JSON"): the share of the per-call time priced from
assumed or unstated numbers (the text's Confidence line) and the chip's out-of-sample check (its
Fidelity line), beside the plan's own keys, which still read back as a Plan. Before, the JSON had
neither."""
from __future__ import annotations

import json
import re

from click.testing import CliRunner

from torchfl.cli.main import cli
from torchfl.planner.plan import Plan


def _explain(*args):
    res = CliRunner().invoke(cli, ["plan", "explain", "mlp", "--chip", "A100-SXM4-80GB", *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_json_has_the_confidence_the_text_shows(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))        # a new user's default registry
    monkeypatch.delenv("TORCHFL_REGISTRY_URL", raising=False)
    text = _explain()
    data = json.loads(_explain("--format", "json"))
    conf = data["confidence"]
    shown = re.search(r"Confidence: (\d+)% of the per-call time", text)
    assert shown, text
    assert round(100 * conf["assumption_share"]) == int(shown.group(1))
    assert conf["shares"] and abs(sum(conf["shares"].values()) - 1) < 1e-3
    # a new user's registry holds the run torchfl ships for the A100: checked, as the Fidelity line says
    assert conf["state"] == "checked" and conf["checked_rows"] >= 100
    assert f"predictions checked on {conf['checked_rows']} published measurements, mean error " \
           f"{conf['out_of_sample_mae']:.0%}" in text
    plan = Plan.from_dict(data)
    assert plan.chip == "A100-SXM4-80GB" and len(plan.steps) == len(data["steps"])
