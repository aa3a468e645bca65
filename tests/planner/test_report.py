"""``torchfl plan report``: one self-contained HTML page, loaded in a real headless Chromium
(Debian's ``chromium``; skipped where it is not installed): no console error, no request
leaves the page, and its figures are there with content."""

import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--enable-logging=stderr", "--v=0")


def _load(page, tmp_path):
    """(DOM after load, console messages) of ``page`` in a fresh Chromium profile."""
    out = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=3000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    console = [line for line in out.stderr.splitlines() if ":CONSOLE" in line]
    return out.stdout, console


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    pytest.importorskip("matplotlib")
    path = tmp_path_factory.mktemp("report") / "report.html"
    res = CliRunner().invoke(cli, ["plan", "report", "resnet18", "--chips", "NPU-V3,TFL-X1,EDGE-C2", "--chip",
                                   "NPU-V3", "--batch", "1", "-o", str(path)])
    assert res.exit_code == 0, res.output
    return path


def test_report_is_self_contained(report):
    text = report.read_text()
    assert text.startswith("<!DOCTYPE html>")
    for fig in ("fig-compare", "fig-graph", "fig-roofline", "fig-memory"):
        assert f'id="{fig}"' in text
    # nothing to fetch: no external URL in any src/href, no script, no link element
    assert not re.search(r'(src|href)\s*=\s*"(?!#)', text) and "<script" not in text and "<link" not in text
    assert "Device memory: peak" in text and "EDGE-C2" in text and "TFL-X1" in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_report_loads_in_chromium_without_console_errors(report, tmp_path):
    # the harness sees console errors: a page that logs one is caught
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>console.error('boom')</script></body></html>")
    _dom, console = _load(bad, tmp_path)
    assert any("boom" in line for line in console), console

    dom, console = _load(report, tmp_path)
    assert console == [], console
    figures = re.findall(r'<figure id="(fig-[a-z]+)"[^>]*>\s*<svg[^>]*width="([\d.]+)pt"', dom)
    assert {f for f, _w in figures} == {"fig-compare", "fig-graph", "fig-roofline", "fig-memory"}, figures
    assert all(float(w) > 100 for _f, w in figures)
    # each figure drew something: paths (data and text-as-paths) inside every SVG
    for fig in ("fig-compare", "fig-graph", "fig-roofline", "fig-memory"):
        body = dom.split(f'<figure id="{fig}"', 1)[1].split("</figure>", 1)[0]
        assert body.count("<path") > 20, fig
