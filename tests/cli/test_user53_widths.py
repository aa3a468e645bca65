"""Issue 53 point 6: `make demo`'s lines reached 103-163 columns in a pipe (the progress
heartbeat with a long model title and the kernel being compiled; sentences printed with rich's
soft wrap). In a pipe every line the demo's progress writes is within 100 columns, wrapped at
spaces; a line that fits (a table row) is written as it is."""
from __future__ import annotations

import io
import time

from torchfl.cli.progress import Progress
from torchfl.cli.render import PipeLines

LONG = ("ResNet-50 (batch 1, 64x64) on NPU-V2: planning + compiling kernels (1/12): still working, 231 s; "
        "compiling conv2d_bn_relu (float16) for 20 s")


def test_pipe_lines_wraps_long_lines_and_keeps_short_ones():
    buf = io.StringIO()
    out = PipeLines(buf)
    out.write("chip    latest   vendor\n" + LONG + "\npartial")
    out.flush()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "chip    latest   vendor"              # spaces kept: a table row fits
    assert all(len(x) <= 100 for x in lines) and len(lines) == 4, lines
    assert lines[2].startswith("    ") and " ".join(" ".join(lines[1:3]).split()) == LONG
    assert lines[3] == "partial"


def test_the_demo_progress_heartbeat_fits_a_pipe():
    buf = io.StringIO()
    with Progress(PipeLines(buf), "compile + run on the emulated chips", total=12, interval=0.2,
                  compiles=False) as p:
        p.update("ResNet-50 (batch 1, 224x224) on NPU-V2: planning + compiling kernels")
        p._compile = ("conv2d_bn_relu_add_relu_with_a_long_name (float16)", time.perf_counter())
        time.sleep(0.8)                                     # a heartbeat or two
    lines = buf.getvalue().splitlines()
    assert "still working" in " ".join(" ".join(lines).split()), lines
    assert all(len(x) <= 100 for x in lines), max(lines, key=len)
