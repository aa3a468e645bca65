"""`torchfl demo` prints what it runs (issue 36): its hard-constraint transcript, run as
printed in a new interpreter (doctest), raises the error the demo shows."""
from __future__ import annotations

import io
import os
import subprocess
import sys

from rich.console import Console

from torchfl.cli.demo_cmd import TRANSCRIPT, hard_constraint
from torchfl.registry import Registry


def test_transcript_is_what_runs_and_reproduces(tmp_path):
    url = f"sqlite:///{tmp_path / 'reg.sqlite3'}"
    Registry(url).init(seed=True)
    buf = io.StringIO()
    assert hard_constraint(Console(file=buf, highlight=False, soft_wrap=True, width=100), url)
    printed = buf.getvalue()
    assert printed.startswith(TRANSCRIPT), printed
    assert ("UnsupportedAttention: MultiheadAttention with num_heads=12 not supported on NPU-V2"
            in " ".join(printed.split()))
    assert all(len(line) <= 100 for line in printed.splitlines()), printed
    # the printed session, verbatim, through doctest in a fresh interpreter
    session = tmp_path / "demo_session.txt"
    session.write_text(printed, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFL_")}
    env["TORCHFL_REGISTRY_URL"] = url
    res = subprocess.run([sys.executable, "-m", "doctest", "-o", "NORMALIZE_WHITESPACE", str(session)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_printed_call_is_the_one_that_raises():
    """What the issue found: `model(x, x, x)` as the old transcript printed it plans 12 heads
    without the attention unit; the transcript must show the call that meets the constraint."""
    assert "need_weights=False" in TRANSCRIPT and "torch.no_grad()" in TRANSCRIPT
