"""Issue 53, leftovers of point 6: every line torchfl prints in a pipe is within 100 columns.

Before: explain analyze's table of the demo's BERT layer reached 107 columns (numbers never
wrap, and its times had 6 digits: ``426.584 us``); the one-off "compiling the emulator's
kernels" notice was one line of 250+ columns; `torchfl kernels warmup` wrote its skipped jobs,
its heartbeat (every running job) and a job's error as single long lines."""
from __future__ import annotations

import io
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NUMBA_CACHE_DIR")}
    env.update(PYTHONPATH=str(ROOT), **extra)
    return env


def _widest(text: str) -> str:
    return max(text.splitlines() or [""], key=len)


def test_analyze_table_of_the_demo_bert_layer_fits_a_pipe(monkeypatch):
    """The demo's BERT layer (quick size) planned for NPU-V3 float16; each step measured as a
    run on this CPU reports it (counted bytes equal, wall times of hundreds of us, as the demo
    printed): the rendered text, in a pipe, within 100 columns, no column left out."""
    monkeypatch.delenv("COLUMNS", raising=False)
    from torchfl.cli import workloads
    from torchfl.planner.api import plan_module
    from torchfl.runtime.analyze import HOST_LABEL, AnalyzedPlan, StepAnalysis, _label, _tile_text

    _key, _title, factory = workloads.models(quick=True)[1]
    module, inputs = factory()
    plan = plan_module(module, inputs, "NPU-V3", precision="float16")
    steps = [StepAnalysis(index=s.index, kind=s.kind, kernel=s.kernel or HOST_LABEL[s.kind], label=_label(s),
                          tile=_tile_text(s), predicted_bytes=s.predicted_bytes, measured_bytes=s.predicted_bytes,
                          predicted_time_s=s.predicted_time_s, simulated_time_s=s.predicted_time_s,
                          wall_s=426.584e-6 if i % 2 else 9.395)
             for i, s in enumerate(plan.steps)]
    an = AnalyzedPlan(plan, steps, {}, 10.0, 9.9, 1 << 20)
    text = an.render()
    assert len(_widest(text)) <= 100, _widest(text)
    lines = text.splitlines()
    header = lines[1:next(i for i, x in enumerate(lines) if x.startswith("----"))]
    assert "wall" in " ".join(header) and "left out" not in text, header
    assert "427 us" in text and "9.39 s" in text        # 3 significant digits in the table


COMPILE = """
import numba
from torchfl.runtime.logs import announce_compiles
announce_compiles()

@numba.njit
def f(x):
    return x + 1

f(1)
"""


def test_the_compile_notice_fits_a_pipe(tmp_path):
    res = subprocess.run([sys.executable, "-c", COMPILE], env=_env(tmp_path, NUMBA_CACHE_DIR=str(tmp_path / "nc")),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "torchfl: compiling the emulator's kernels for this model" in res.stderr, res.stderr
    assert len(_widest(res.stderr)) <= 100, _widest(res.stderr)
    assert "`torchfl kernels warmup` compiles" in " ".join(res.stderr.split())


def test_kernels_warmup_in_a_pipe(tmp_path):
    """Every demo job already warmed up: the command says so, within 100 columns."""
    from torchfl.cli import workloads
    from torchfl.cli.kernels_cmd import _record, job_name

    cache = tmp_path / "nc"
    for chip in workloads.CHIPS:
        for key, _t, _f in workloads.models(False):
            _record(cache, job_name(key, chip, False), 1.0)
    url = f"sqlite:///{tmp_path / 'reg.db'}"
    env = _env(tmp_path, NUMBA_CACHE_DIR=str(cache), TORCHFL_REGISTRY_URL=url)
    init = subprocess.run([sys.executable, "-m", "torchfl.cli", "registry", "init"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert init.returncode == 0, init.stderr
    res = subprocess.run([sys.executable, "-m", "torchfl.cli", "kernels", "warmup"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "already warmed up" in res.stdout and "bert-layer@NPU-V3" in res.stdout, res.stdout
    assert len(_widest(res.stdout)) <= 100, _widest(res.stdout)


def test_warmup_progress_wraps_like_the_demo(tmp_path):
    """The warmup's progress with three jobs running (the heartbeat names them all) and a job
    that fails with a long error: every line within 100 columns, wrapped at spaces."""
    from torchfl.cli.kernels_cmd import _follow, progress_of

    buf, events, failures = io.StringIO(), queue.Queue(), []
    names = [("bert-base", "NPU-V2-with-a-long-variant-name"), ("resnet50", "NPU-V3-with-a-long-variant-name"),
             ("gpt2", "A100-SXM4-80GB")]
    for i, (model, chip) in enumerate(names):
        events.put(("start", 100 + i, model, chip))

    def finish():
        time.sleep(1.0)                                   # a heartbeat or two while all three run
        for model, chip in names:
            events.put(("done", 100, model, chip, 1.0, "KernelError: " + "a long reason, " * 12))

    threading.Thread(target=finish, daemon=True).start()
    with progress_of(buf, len(names), 3, interval=0.2) as p:
        _follow(p, events, [], len(names), tmp_path, False, failures)
    text = buf.getvalue()
    assert "still working" in text and len(failures) == 3, text
    assert len(_widest(text)) <= 100, _widest(text)
