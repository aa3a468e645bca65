"""Issue 53 point 12: outputs that read one way only. `conformance --sweeps` has a header and
no doubled word ("conformance conformance TFL-X1"); the demo's accuracy line cannot read as if
the reference's largest value were the ratio; `conformance --dtypes float32` on a chip without
float32 answers "refused" instead of "0 cases" with no verdict."""
from __future__ import annotations

from click.testing import CliRunner

from torchfl.cli.demo_cmd import accuracy_text
from torchfl.cli.main import cli
from torchfl.registry import Registry
from torchfl.registry.sweeps import Sweeps


def test_sweeps_listing_has_a_header_and_no_doubled_kind(tmp_path):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    reg = Registry(url)
    reg.init(seed=True)
    Sweeps(reg).start("conformance", "conformance TFL-X1 (2 ops, float32)", {"chip": "TFL-X1"}, ["neg float32"],
                      driver="test")
    res = CliRunner().invoke(cli, ["conformance", "--sweeps", "--registry", url])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == ["run", "kind", "what", "units", "status"], lines
    assert "conformance conformance" not in res.output
    assert "TFL-X1 (2 ops, float32)" in res.output and "partial: finish it with --resume 1" in res.output


def test_accuracy_line_says_which_number_is_the_share():
    text = accuracy_text(3.09e-05, 0.00053)
    assert text == "largest |diff| 3.09e-05 = 0.053% of the largest |output|", text
    assert "relative to max |ref|" not in text


def test_conformance_of_a_dtype_the_chip_lacks_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    Registry(url).init(seed=True)
    res = CliRunner().invoke(cli, ["conformance", "--chip", "NPU-V3", "--ops", "relu", "--dtypes", "float32",
                                   "--registry", url])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "NPU-V3: float32: refused: NPU-V3 1.0.0 has no float32: compute_units.fp32 is absent" in text, text
    assert "0 cases" not in text and "not recorded" in text
    assert Registry(url).conformance_runs() == []
