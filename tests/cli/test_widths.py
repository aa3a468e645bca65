"""What the CLI prints fits the screen (issue 36): in a pipe every line is at most 100
columns, on a terminal ``COLUMNS`` is honoured, and no cell or sentence is cut: long text
wraps at spaces (identifiers after their underscores only where a column needs it)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchfl.planner.texttable import PIPE_WIDTH, paragraph, table, terminal_width

ROOT = Path(__file__).resolve().parents[2]
# a located diagnostic (`file:line[:col]: ...`) stays one line, as compilers print it (editors
# and grep read it): the one kind of line allowed past the width
LOCATED = re.compile(r"^\s*[\w./-]+:\d+(:\d+)?: ")
# one word longer than a line (a path, a URL, a hash) stands alone on its line, never cut
# (texttable.paragraph): the other kind allowed past the width
ALONE = re.compile(r"^\s*\S+$")

# (command, exit status): the main commands in a pipe; the README's own are run by tests/test_readme.py.
# `hcd validate` prints only located diagnostics (one per line, see LOCATED).
COMMANDS = [
    ("hcd show hcd_registry/npu_v3.hcd", 0),
    ("hcd validate hcd_registry/npu_v2.hcd hcd_registry/npu_v3.hcd", 0),
    ("registry list", 0),
    ("registry history NPU-V3", 0),
    ("registry ops --chip NPU-V3", 0),
    ("registry ops --chip DSP-M4", 0),
    ("registry support aten.convolution.default", 0),
    ("registry why-not aten.scaled_dot_product_attention.default --chip NPU-V2 --dtype float32", 0),
    ("kernels info", 0),
    ("conformance --report", 0),
    ("plan explain mlp --chip NPU-V3", 0),
    ("plan explain mlp --chip TFL-X1 --format dot", 0),
    ("plan memory mlp --chip EDGE-C2", 0),
    ("plan compare mlp", 0),
    ("plan --help", 0),
    ("plan explain --help", 0),
]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    base = tmp_path_factory.mktemp("widths")
    e = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_") and k not in ("COLUMNS", "LINES")}
    e["XDG_DATA_HOME"] = str(base / "data")
    e["PYTHONPATH"] = str(ROOT)
    return e


def _run(cmd: str, env, columns: str | None = None):
    if columns is not None:
        env = dict(env, COLUMNS=columns)
    return subprocess.run([sys.executable, "-m", "torchfl.cli", *cmd.split()], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)


@pytest.mark.parametrize("cmd,status", COMMANDS, ids=[c for c, _s in COMMANDS])
def test_fits_100_columns_in_a_pipe(cmd, status, env):
    res = _run(cmd, env)
    assert res.returncode == status, res.stdout[-3000:]
    if "--format dot" in cmd:
        return          # a Graphviz file, not text for a screen
    wide = [line for line in res.stdout.splitlines()
            if len(line) > PIPE_WIDTH and not LOCATED.match(line) and not ALONE.match(line)]
    assert not wide, f"`torchfl {cmd}` printed {len(wide)} line(s) over {PIPE_WIDTH} columns, e.g.\n" + wide[0]


def test_hcd_show_keeps_the_content_hash_whole(env):
    res = _run("hcd show hcd_registry/npu_v3.hcd", env)
    assert re.search(r"\b[0-9a-f]{64}\b", res.stdout), res.stdout


def test_columns_is_honoured(env):
    wide = _run("plan explain mlp --chip NPU-V3", env, columns="200")
    assert wide.returncode == 0
    longest = max(len(x) for x in wide.stdout.splitlines())
    assert PIPE_WIDTH < longest <= 200
    narrow = _run("plan explain mlp --chip NPU-V3", env, columns="80")
    assert max(len(x) for x in narrow.stdout.splitlines()) <= 80


def test_terminal_width_rules(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert terminal_width(open(os.devnull, "w")) == PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "150")
    assert terminal_width() == 150
    monkeypatch.setenv("COLUMNS", "3")              # nonsense: ignored
    assert terminal_width(open(os.devnull, "w")) == PIPE_WIDTH


def test_table_never_breaks_a_word_that_fits():
    """The defect the issue shows: 8-wide cells broke 'weight_stationary' into
    'weight_s/tationar/y'. Words that fit a column wrap whole."""
    rows = [("268", "weight_stationary (k=64 oh=112 ow=112 c=3) 2buf", "x:NCHW weight:NCHW -> NCHW", "33.7 us"),
            ("269", "streamed (c=64 oh=56 ow=56) 2buf", "NCHW", "15.7 us")]
    lines = table(("#", "tiling", "layout", "time"), rows, right={0, 3}, width=50)
    assert all(len(x) <= 50 for x in lines)
    text = " ".join(" ".join(lines).split())
    for word in ("weight_stationary", "(k=64", "oh=112", "x:NCHW", "weight:NCHW", "streamed", "2buf"):
        assert re.search(rf"(^|\s){re.escape(word)}(\s|$)", text), (word, lines)


def test_identifiers_break_only_after_underscores():
    text = "conv2d+_native_batch_norm_legit_no_training+relu [conv2d_1..relu_1]"
    lines = table(("covers", "n"), [(text, "1")], right={1}, width=24)
    assert all(len(x) <= 24 for x in lines)
    pieces = [x[:22].rstrip() for x in lines[2:]]
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    pos = 0
    for p in pieces[:-1]:               # each line ends at a space, '+', or after '_' / '.' inside a name
        pos = text.index(p, pos) + len(p)
        assert text[pos - 1] in "+_." or text[pos] == " ", (p, pieces)


def test_optional_columns_are_left_out_and_named():
    rows = [("NPU-V3", "1.0.0", "2.36 ms", "1.2 ms", "57", "53")]
    lines = table(("chip", "version", "per call", "run once", "kernels", "fused"), rows, right={2, 3, 4, 5},
                  optional=(5, 4), width=44)
    assert all(len(x) <= 44 for x in lines)
    assert "fused" in lines[-2] + lines[-1] and "--json" in " ".join(lines[-2:])
    assert "2.36 ms" in lines[2] and "1.2 ms" in lines[2]


def test_paragraph_keeps_long_words_whole():
    h = "ab6bd6b896bf28af70188c7884e3459fc0fdf467bda1d05e4d138cd6033bfa4e"
    lines = paragraph(f"content hash {h} of the chip", width=40)
    assert h in [x.strip() for x in lines]


def test_a_registry_url_longer_than_a_line_stands_alone(tmp_path, env):
    """The title of `registry history` names the registry's URL: under a deep directory (pytest's
    own under xdist) the title wrapped nowhere and ran past the width."""
    deep = tmp_path / ("d" * 90)
    res = _run("registry history NPU-V3", dict(env, XDG_DATA_HOME=str(deep)))
    assert res.returncode == 0, res.stdout[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0] == "chip NPU-V3 in" and str(deep) in lines[1], lines[:3]
    assert all(len(x) <= PIPE_WIDTH or ALONE.match(x) for x in lines), lines
